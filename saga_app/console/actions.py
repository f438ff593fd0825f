"""What an operator can do from the console: the CLI's decisions and dead-letter operations,
sent as the same AMQP commands from the console's broker account, each naming the person
signed in (``SagaClient.on_behalf_of``), so the register records who, never a form field."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from pydantic import ValidationError

from saga_coordinator.register import SagaState
from saga_shared.client import CommandRejected, DeskRefused, SagaClient
from saga_shared.model.messages import DeskReply
from saga_shared.transport.codec import describe

# name: (the form field it needs, whether it may be blank, whether to ask first)
DECISIONS: dict[str, tuple[str, bool, bool]] = {
    "approve": ("note", True, False),
    "resume": ("note", True, False),
    "reject": ("reason", False, True),
    "abort": ("reason", False, True),
    "resolve": ("note", False, True),
    # A step in doubt, settled by a person (who checked the system itself).
    "happened": ("note", False, True),
    "did_not_happen": ("note", False, True),
}
SETTLES = ("happened", "did_not_happen")
_MAX_TEXT = 2000


class ActionRefused(Exception):
    """The form was wrong or the coordinator refused: shown to the person as it is."""


@dataclass(frozen=True)
class Done:
    message: str


def checked_text(decision: str, text: str) -> str:
    field, blank_ok, _ = DECISIONS[decision]
    text = text.strip()
    if not text and not blank_ok:
        raise ActionRefused(f"{decision} needs a {field}: say why, for the register")
    if len(text) > _MAX_TEXT:
        raise ActionRefused(f"the {field} is {len(text)} characters; at most {_MAX_TEXT}")
    return text


async def decide(
    client: SagaClient, person: str, decision: str, state: SagaState, text: str
) -> Done:
    """``state``: the register as the person saw it (a gate's or a doubtful step's index and
    the version the decision is made on go with the command)."""
    if decision not in DECISIONS:
        raise ActionRefused(f"no such decision: {decision[:40]!r}")
    field = DECISIONS[decision][0]
    saga_id, order_id = state.saga_id, state.order_id
    words = {field: checked_text(decision, text)}
    you = client.on_behalf_of(person)
    try:
        if decision in SETTLES:
            step = next((s.index for s in state.steps if s.status == "in_doubt"), None)
            if step is None:
                raise ActionRefused(f"saga {saga_id} has no step in doubt")
            reply = await you.settle(saga_id, order_id=order_id, step=step,
                                     happened=decision == "happened", version=state.version,
                                     note=words["note"])  # fmt: skip
            return Done(f"settled: {reply.reason}")
        gate = next((s.index for s in state.steps if s.gate_status == "waiting"), None)
        extra = {"step": gate} if decision in ("approve", "reject") else {}
        await getattr(you, decision)(saga_id, order_id=order_id, **words, **extra)
    except CommandRejected as exc:
        raise ActionRefused(f"refused: {exc.reason}") from None
    except TimeoutError:
        raise ActionRefused("no answer from the coordinator: is it running?") from None
    return Done(f"{decision}: sent for saga {saga_id}, accepted by the coordinator")


async def abort_many(
    client: SagaClient, person: str, sagas: list[tuple[str, str]], reason: str, batch: str
) -> Done:
    """Abort each of ``sagas`` (saga ID, order ID) for ``person``. Each abort's message ID is
    the confirmation's ``batch`` and the saga: the same confirmation sent twice is absorbed by
    the coordinator, never a second abort."""
    reason = checked_text("abort", reason)
    you = client.on_behalf_of(person)
    refused: list[str] = []

    async def one(saga_id: str, order_id: str) -> None:
        try:
            await you.abort(saga_id, order_id=order_id, reason=reason,
                            message_id=f"bulk-{batch}-{saga_id}")  # fmt: skip
        except CommandRejected as exc:
            refused.append(f"{saga_id}: {exc.reason}")
        except TimeoutError:
            refused.append(f"{saga_id}: no answer from the coordinator")

    for start in range(0, len(sagas), 32):  # a few in flight: the coordinator answers each
        await asyncio.gather(*(one(s, o) for s, o in sagas[start : start + 32]))
    done = len(sagas) - len(refused)
    text = f"abort: {done} of {len(sagas)} accepted by the coordinator"
    if refused:
        text += f"; refused {len(refused)}: " + "; ".join(refused[:5])
    return Done(text)


async def replay(
    client: SagaClient,
    person: str,
    *,
    dead_letter_id: int | None = None,
    order_id: str | None = None,
    death_reason: str | None = None,
    note: str = "",
) -> Done:
    """One letter, an order's, or those that died for one reason: one desk command, which
    replays each order's in its arrival order."""
    try:
        reply = await client.on_behalf_of(person).replay_dead_letters(
            dead_letter_id=dead_letter_id, order_id=order_id, death_reason=death_reason,
            note=note,
        )  # fmt: skip
    except ValidationError as exc:
        raise ActionRefused(f"not a replay this console can send: {describe(exc)}") from None
    except (CommandRejected, DeskRefused) as exc:
        raise ActionRefused(f"refused: {exc}") from None
    except TimeoutError:
        raise ActionRefused("no answer from the coordinator: is it running?") from None
    return Done(_summary([reply], "replayed"))


async def discard(client: SagaClient, person: str, dl_id: int, reason: str) -> Done:
    reason = reason.strip()
    if not reason:
        raise ActionRefused("discard needs a reason, for the audit trail")
    try:
        reply = await client.on_behalf_of(person).discard_dead_letter(dl_id, reason=reason)
    except (CommandRejected, DeskRefused) as exc:
        raise ActionRefused(f"refused: {exc}") from None
    except TimeoutError:
        raise ActionRefused("no answer from the coordinator: is it running?") from None
    return Done(_summary([reply], "discarded"))


def _summary(replies: list[DeskReply], verb: str) -> str:
    results = [r for reply in replies for r in reply.results]
    if not results:
        return f"nothing {verb}: no dead letters left there"
    lines = [f"dead letter {r['id']}: {r['detail']}" for r in results[:20]]
    if len(results) > 20:
        lines.append(f"and {len(results) - 20} more")
    return "; ".join(lines)
