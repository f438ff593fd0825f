"""A service's answer to a settle (``action.settle``): which way an idempotency key went, from
its key record, fencing it when nobody claimed it (see ``saga_coordinator.doubt``).

An unfinished claim is ``running`` while its lease is live; once it has expired the service's
``status`` hook is asked (the system's own record decides), else it is ``in_doubt``. When a
person said it did not happen (``fence_expired``), an expired claim is fenced and the answer is
``fenced``, unless a call claimed the key after that word (``fence_claims``: the claims the
person knew of); a live one is never fenced.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from saga_services.keys import KeyState, KeyStore
from saga_services.outcome import MAX_REASON, OUTCOME_NAMESPACE
from saga_services.sdk import KeyQuery, KeyStatus, Service
from saga_shared.model.ids import name_id
from saga_shared.model.messages import ActionSettled, SettleRequest, SettleVerdict
from saga_shared.model.text import clean

log = logging.getLogger(__name__)
STATUS_TIMEOUT_S = 10.0


async def answer(
    req: SettleRequest, service: Service[Any], keys: KeyStore, deps: Any
) -> ActionSettled:
    why = "fenced at a person's word that it did not happen; its claim had expired"
    query = KeyQuery(req.idempotency_key, req.action, req.order_id)
    bound = req.fence_claims if req.fence_expired else None
    state, asked, _ = await look(query, service, keys, deps, fence=why if req.fence_expired else "",
                                 fence_claims=bound)  # fmt: skip
    verdict, reason = _verdict(state, service, asked)
    if bound is not None and state.found == "expired" and state.claims > bound:
        reason = (
            f"not fenced: {state.claims} call(s) have claimed the key, {bound} when it "
            f"was said not to have happened; a later one may have landed: {reason}"
        )
    return ActionSettled(
        message_id=name_id(OUTCOME_NAMESPACE, f"{req.message_id}|settled"),
        saga_id=req.saga_id, order_id=req.order_id, action=req.action, step=req.step,
        idempotency_key=req.idempotency_key, attempt=req.attempt, verdict=verdict,
        result=state.result if verdict == "done" else None, reason=clean(reason, MAX_REASON),
        effect_unknown=verdict == "failed" and state.landed,
        lease_s=state.lease_s if verdict == "running" else None, claims=state.claims,
    )  # fmt: skip


async def look(
    query: KeyQuery, service: Service[Any], keys: KeyStore, deps: Any, *, fence: str = "",
    fence_claims: int | None = None,
) -> tuple[KeyState, str, bool]:  # fmt: skip
    """What the key holds, from the key record (fencing it when nobody claimed it) and, for
    an unfinished claim, the service's status hook; ``fence``: why to fence a claim whose lease
    expired (a person's word, a compensation about to undo it), ``fence_claims``: only if no
    call claimed it since that many claims. Returns the state, what the hook said, and whether
    a fence came over a claim that may have landed first."""
    state = await keys.settle(query.key, service.name, query.action, query.order_id)
    asked = ""
    if state.found in ("running", "expired") and service.status is not None:
        state, asked = await _ask_the_system(query, service, keys, deps, state)
    if state.found == "expired" and fence:
        fenced = await keys.fence(query.key, service.name, query.action, query.order_id, fence,
                                  fence_claims)  # fmt: skip
        return fenced, asked, fenced.found == "fenced"
    return state, asked, False


async def _ask_the_system(
    query: KeyQuery, service: Service[Any], keys: KeyStore, deps: Any, state: KeyState
) -> tuple[KeyState, str]:
    """The system's own record decides an unfinished claim: done is stored as done; fenced or
    failed (it never will happen) fences an expired claim (a live one answers as it ends)."""
    assert service.status is not None
    try:
        said = await asyncio.wait_for(service.status(query, deps), STATUS_TIMEOUT_S)
    except Exception as exc:  # the system cannot tell now: as if it had no hook
        log.warning("%s status(%s) failed: %r", service.name, query.key, exc)
        return state, f"its status hook failed: {exc!r}"
    if not isinstance(said, KeyStatus) or said.state == "unknown":
        return state, "its status hook does not know"
    if said.state == "done":
        await keys.record(query.key, said.result or {})
        return KeyState("done", said.result or {}, owner=state.owner), ""
    why = said.reason or f"{service.name} says it never happened and never will"
    if state.found == "expired":
        await keys.fence(query.key, service.name, query.action, query.order_id, why)
    return KeyState("fenced", error=why, owner=state.owner), ""


def _verdict(state: KeyState, service: Service[Any], asked: str) -> tuple[SettleVerdict, str]:
    if state.found in ("done", "failed", "fenced"):
        return state.found, state.error or ""
    if state.found == "running":
        return "running", (f"claimed by {state.owner}, {state.lease_s or 0:.1f}s of its lease "
                           "left: its call may still answer")  # fmt: skip
    hook = asked or f"{service.name} has no status hook to ask"
    return "in_doubt", (f"claimed by {state.owner or 'a call'}, never finished, its lease over "
                        f"{state.lease_s or 0:.1f}s ago; {hook}")  # fmt: skip
