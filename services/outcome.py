"""Pure rules for what an adapter reports: the outcome message, its id, ``effect_unknown``."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Literal

from pydantic import JsonValue

from saga_services.errors import Permanent, Transient
from saga_shared.errors import InvalidMessage
from saga_shared.model.ids import name_id
from saga_shared.model.messages import ActionDone, ActionFailed, ActionRequest, SettleVerdict
from saga_shared.model.text import clean
from saga_shared.transport.codec import check_shape

# Fixed forever: changing it changes every outcome id, so in-flight duplicates would stop being
# recognised as duplicates by the coordinator's inbox.
OUTCOME_NAMESPACE = uuid.UUID("6f1d3c52-8a0e-4f7b-9b0c-2d4e5a7c9e13")
MAX_REASON = 4000


@dataclass(frozen=True)
class Done:
    result: dict[str, JsonValue]


Verdict = Done | Transient | Permanent


@dataclass(frozen=True)
class Running:
    """Another live process holds the key's claim and is calling it: its answer is the
    answer. Not a failure and not doubt; nothing is reported for this delivery (the step's
    deadline stays the backstop should the holder never answer)."""

    holder: str | None
    lease_s: float


def outcome_message_id(
    idempotency_key: str, outcome: Literal["done", "failed"], attempt: int
) -> str:
    """Deterministic, so a redelivered request yields a duplicate the inbox absorbs."""
    return name_id(OUTCOME_NAMESPACE, f"{idempotency_key}|{outcome}|{attempt}")


def effect_unknown(verdict: Verdict) -> bool:
    """A refusal is the system saying no: nothing landed. Exhausted transient retries (a
    timeout, a 5xx) may have landed anyway, so the coordinator must compensate them too; the
    error says which."""
    return not isinstance(verdict, Done) and verdict.may_have_landed


def reason_of(verdict: Transient | Permanent, tries: int) -> str:
    text = str(verdict) or type(verdict).__name__
    if isinstance(verdict, Transient):
        text = f"gave up after {tries} tries: {text}"
    return clean(text, MAX_REASON)  # a system's error text may hold anything


def unfit_result(result: dict[str, object]) -> str | None:
    """Why a system's result cannot travel in a message (a control character, a huge number),
    or None. Such a result is reported as a failure whose effect may have landed."""
    try:
        check_shape(result)
    except InvalidMessage as exc:
        return exc.reason
    return None


def build_outcome(
    req: ActionRequest, verdict: Verdict, tries: int, forward: SettleVerdict | None = None
) -> ActionDone | ActionFailed:
    """``tries``: the attempt the key record counted for this send; ``forward``: for a
    compensation, what its forward key held when it ran."""
    if isinstance(verdict, Done):
        unfit = unfit_result(dict(verdict.result))
        if unfit is not None:
            reason = f"{req.action} answered with a result that cannot be carried: {unfit}"
            return ActionFailed(
                message_id=outcome_message_id(req.idempotency_key, "failed", req.attempt),
                saga_id=req.saga_id, order_id=req.order_id, action=req.action,
                phase=req.phase, step=req.step, idempotency_key=req.idempotency_key,
                attempt=req.attempt, tries=max(tries, 1), reason=clean(reason, MAX_REASON),
                effect_unknown=True, forward=forward,
            )  # fmt: skip
        return ActionDone(
            message_id=outcome_message_id(req.idempotency_key, "done", req.attempt),
            saga_id=req.saga_id,
            order_id=req.order_id,
            action=req.action,
            phase=req.phase,
            step=req.step,
            idempotency_key=req.idempotency_key,
            attempt=req.attempt,
            tries=max(tries, 1),
            result=verdict.result,
            forward=forward,
        )
    return ActionFailed(
        message_id=outcome_message_id(req.idempotency_key, "failed", req.attempt),
        saga_id=req.saga_id,
        order_id=req.order_id,
        action=req.action,
        phase=req.phase,
        step=req.step,
        idempotency_key=req.idempotency_key,
        attempt=req.attempt,
        tries=max(tries, 1),
        reason=reason_of(verdict, tries),
        effect_unknown=effect_unknown(verdict),
        forward=forward,
    )
