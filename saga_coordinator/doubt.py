"""Steps in doubt, pure: an irreversible action whose outcome is unknown is settled before
anything acts on it (design rule 2: nothing is compensated around it, no later step runs).

A forward call is in doubt when its last deadline passed, or its service said it may have
landed (a timeout, a crash mid-call). The coordinator then sends a *settle* to the service
that owns it (``action.settle``, its own deadline and resends): the service answers from its
key record with the same atomic insert-if-absent its calls claim keys with, so a key never
claimed is fenced for ever and no late request can land after the answer. The answer decides:

- ``done``: it happened; the saga goes on as if the outcome had come in time;
- ``fenced`` / ``failed``: it did not happen; the steps before it are compensated;
- ``running``: a live call holds the key; its outcome (or the settle's next send) will tell;
- ``in_doubt`` from the last send, or no answer at all: ``needs_human``, with the register
  saying what may have happened. Until the step is settled a late outcome or answer still
  settles it; a person may settle it too ("happened" at once; "did not happen" once the
  service has fenced the key, which it refuses while a claim on it is live).

An abort that comes while an irreversible step is out settles that step first; its answer
waits for the settle and says which way it went. (A compensable step in doubt needs none of
this: its compensation fences its forward key, see ``machine.on_compensation_outcome``.)
"""

from __future__ import annotations

from datetime import datetime

from pydantic import JsonValue

from saga_coordinator.progress import abort_overtaken, advance, begin_compensation, land
from saga_coordinator.register import Awaiting, SagaState, Settled, Step, forward_key
from saga_coordinator.transition import (
    Outgoing,
    Reply,
    Transition,
    decided,
    event,
    ignored,
    refuse,
    reply,
    settle_request,
)
from saga_shared.model.catalog import ActionClass
from saga_shared.model.messages import (
    AbortSaga,
    ActionDone,
    ActionFailed,
    ActionSettled,
    CommandReply,
    DeadlineReached,
    SettleSaga,
)


def into_doubt(state: SagaState, step: Step, reason: str, now: datetime) -> Transition:
    """A forward call's outcome is unknown: ask its service (the first settle)."""
    step = step.evolve(status="in_doubt", error=reason, effect_unknown=True, doubt=reason,
                       finished_at=now)  # fmt: skip
    out: list[Outgoing] = []
    state = _send_settle(state.with_step(step, updated_at=now), step, now, out, rounds=True)
    return Transition(state, tuple(out), note=f"step {step.index} in doubt: settling")


def settle_first(state: SagaState, step: Step, now: datetime, out: list[Outgoing]) -> SagaState:
    """An abort came while ``step`` (irreversible) is out: fence it now if it never started."""
    return _send_settle(state, step, now, out, rounds=True)


def _send_settle(
    state: SagaState, step: Step, now: datetime, out: list[Outgoing], *, rounds: bool = False,
    fence: bool | None = None,
) -> SagaState:  # fmt: skip
    """One settle send; ``rounds``: it starts a round of ``max_sends`` sends."""
    sends = step.settle_sends + 1
    limit = sends + step.max_sends - 1 if rounds else step.settle_limit
    step = step.evolve(settle_sends=sends, settle_limit=limit, settling=True,
                       settle_fence=step.settle_fence if fence is None else fence)  # fmt: skip
    state = state.with_step(step, updated_at=now)
    out.append(settle_request(state, step, now))
    if sends == 1 or rounds:
        out.append(event(state, "step.in_doubt", now, step, detail=step.doubt or "settling"))
    return state


def on_settled(state: SagaState, message: ActionSettled, now: datetime) -> Transition:
    step = state.step(message.step)
    if (
        step is None
        or step.action != message.action
        or message.idempotency_key != forward_key(state.saga_id, step.action)
        or step.status not in ("running", "in_doubt")
        or (step.status == "running" and not step.settling)
    ):
        return ignored(state, f"stale settle answer for step {message.step}")
    learnt = message.claims is not None and message.claims > step.key_claims
    if learnt:
        step = step.evolve(key_claims=message.claims or 0)
        state = state.with_step(step)
    verdict = message.verdict
    if verdict == "done":
        return settle(state, step, "happened", f"{service(step)} (its key record)", now,
                      result=message.result or {})  # fmt: skip
    if verdict == "fenced" or (verdict == "failed" and not message.effect_unknown):
        why = message.reason or f"{service(step)} fenced its key: it never ran"
        return settle(state, step, "did_not_happen", f"{service(step)} (its key record)", now,
                      why=why)  # fmt: skip
    if verdict == "running" or message.attempt != step.settle_sends or not step.settling:
        # A live call holds the key: its outcome, or the settle's next send, will tell.
        note = f"settle of step {step.index}: {verdict}, waiting"
        return Transition(state.with_step(step.evolve(doubt=message.reason or verdict)), (),
                          note=note, changed=learnt or message.reason != step.doubt)  # fmt: skip
    why = message.reason or f"{service(step)} cannot tell whether it happened"
    return stuck(state, step, why, now)


def on_deadline(state: SagaState, message: DeadlineReached, now: datetime) -> Transition:
    """No answer to a settle in time: send it again, or stop for a person."""
    step = state.step(message.step)
    if (
        step is None
        or not step.settling
        or message.attempt != step.settle_sends
        or message.idempotency_key != forward_key(state.saga_id, step.action)
    ):
        return ignored(state, f"stale settle deadline for step {message.step}")
    if step.settle_sends < step.settle_limit:
        out: list[Outgoing] = []
        state = _send_settle(state, step, now, out)
        return Transition(state, tuple(out), note=f"step {step.index} settle sent again")
    why = f"no answer from {service(step)} to {step.settle_sends} settle request(s)"
    return stuck(state, step, why, now)


def outcome_while_settling(
    state: SagaState, step: Step, message: ActionDone | ActionFailed, now: datetime
) -> Transition:
    """The call's own outcome while it is in doubt or being settled: it settles the step if it
    says which way it went."""
    tries = step.attempts + message.tries
    by = "its outcome" if step.status == "running" else "its late outcome"
    if isinstance(message, ActionDone):
        return settle(state, step.evolve(attempts=tries), "happened", by, now,
                      result=message.result)  # fmt: skip
    if not message.effect_unknown:
        return settle(state, step.evolve(attempts=tries), "did_not_happen", by, now,
                      why=message.reason)  # fmt: skip
    if step.status == "running":  # the settle already out will tell
        step = step.evolve(status="in_doubt", attempts=tries, error=message.reason,
                           effect_unknown=True, doubt=message.reason, finished_at=now)  # fmt: skip
        return Transition(state.with_step(step, updated_at=now), (),
                          note=f"step {step.index} in doubt: settling")  # fmt: skip
    return ignored(state, f"step {step.index} still in doubt: {message.reason}")


def settle(
    state: SagaState, step: Step, way: Settled, by: str, now: datetime, *,
    result: dict[str, JsonValue] | None = None, why: str = "",
) -> Transition:  # fmt: skip
    """``step`` is known to have happened or not: the saga goes on from what it was doing."""
    out: list[Outgoing] = []
    step = step.evolve(settled=way, settled_by=by, settling=False, finished_at=now)
    if state.status == "needs_human":
        state = state.evolve(status=state.paused_from or "running", paused_from=None,
                             needs_human_reason=None)  # fmt: skip
    if way == "happened":
        step = step.evolve(status="done", result=result or {}, error=None,
                           landed_seq=state.landed_count + 1)  # fmt: skip
        if state.status == "compensating" and all(s.status != "skipped" for s in state.steps):
            state = abort_overtaken(state, step, now)  # the abort came too late for it
        state = land(state, step, now)
        text = f"{step.action} happened (said by {by})"
    else:
        step = step.evolve(status="failed", effect_unknown=False, landed_seq=None,
                           error=step.error or why, doubt=why or step.doubt)  # fmt: skip
        state = land(state, step, now)
        text = f"{step.action} did not happen (said by {by})"
        if state.status == "running":
            state = begin_compensation(state, f"step {step.index} {step.action}: {why}", now, out)
    out.append(event(state, "step.settled", now, step, detail=text))
    state = _answer(state, way, text, now, out)
    return Transition(advance(state, now, out), tuple(out), note=f"step {step.index}: {text}")


def stuck(state: SagaState, step: Step, why: str, now: datetime) -> Transition:
    """Still in doubt: a person must settle it; the order stays locked meanwhile."""
    step = step.evolve(status="in_doubt", settling=False, doubt=why, effect_unknown=True)
    reason = (
        f"step {step.index} {step.action} may have happened: {why}; settle it with "
        f"`saga settle {state.saga_id} --step {step.index} --happened` or `--did-not-happen`"
    )
    paused = state.status if state.status != "needs_human" else state.paused_from
    state = state.with_step(step, status="needs_human", needs_human_reason=reason,
                            paused_from=paused, updated_at=now)  # fmt: skip
    out: list[Outgoing] = []
    state = _answer(state, None, f"{step.action} is in doubt: {why}", now, out)
    out.append(event(state, "saga.needs_human", now, step, detail=reason, register=True))
    return Transition(state, tuple(out), note=f"step {step.index} in doubt: needs_human")


def person_settles(state: SagaState, command: SettleSaga, now: datetime) -> Transition:
    """A person's "it happened" takes effect at once; "it did not" once the service has fenced
    the key (a settle that may fence a claim whose lease expired; refused while it is live)."""
    step = state.step(command.step)
    if step is None or step.status != "in_doubt":
        what = "no such step" if step is None else f"{step.status}"
        how = f", settled by {step.settled_by}" if step is not None and step.settled_by else ""
        return refuse(state, command, now, f"step {command.step} is not in doubt ({what}{how})")
    if command.version is not None and command.version != state.version:
        reason = (
            f"the register is at version {state.version}, not {command.version}: it "
            "changed since it was read; read it again and decide on what it says now"
        )
        return refuse(state, command, now, reason)  # fmt: skip
    if step.settling:
        return refuse(state, command, now, f"a settle of step {step.index} is out: wait for it")
    kind = "settle_happened" if command.happened else "settle_did_not_happen"
    decision = decided(kind, command.note, command, now, step.index)
    state = state.evolve(decisions=(*state.decisions, decision))
    who = decision.by or "a person"
    if command.happened:
        transition = settle(state, step, "happened", who, now)
        return Transition(transition.state, (*reply(command, now), *transition.out),
                          note=transition.note)  # fmt: skip
    out: list[Outgoing] = []
    state = state.evolve(
        status=state.paused_from or "running", paused_from=None, needs_human_reason=None,
        awaiting=(*state.awaiting, _awaiting(command, "did_not_happen")),
    )  # fmt: skip
    step = step.evolve(fence_claims=step.key_claims)
    state = _send_settle(state, step, now, out, rounds=True, fence=True)
    return Transition(state, tuple(out), note=f"step {step.index}: {who} says it did not happen")


def resettle(state: SagaState, now: datetime, out: list[Outgoing]) -> SagaState:
    """``resume`` of a saga stopped on a step in doubt: ask its service again."""
    for step in state.steps:
        if step.status == "in_doubt" and not step.settling:
            state = state.evolve(status=state.paused_from or "running", paused_from=None,
                                 needs_human_reason=None)  # fmt: skip
            state = _send_settle(state, step, now, out, rounds=True, fence=False)
    return state


def abort_in_flight(state: SagaState, command: AbortSaga, now: datetime) -> tuple[SagaState, bool]:
    """An abort while an irreversible step is out (running, or in doubt and settling): its
    answer waits for that step to be settled. Returns the state and whether it waits."""
    out_now = next((s for s in state.steps if s.action_class is ActionClass.IRREVERSIBLE
                    and (s.status == "running" or (s.status == "in_doubt" and s.settling))),
                   None)  # fmt: skip
    if out_now is None or command.reply_to is None:
        return state, out_now is not None
    return state.evolve(awaiting=(*state.awaiting, _awaiting(command, None))), True


def _awaiting(command: AbortSaga | SettleSaga, claimed: Settled | None) -> Awaiting:
    return Awaiting(
        reply_to=command.reply_to or "", command_id=command.client_message_id or
        command.message_id, command_type=command.type, claimed=claimed,
        message_id=command.message_id,
    )  # fmt: skip


def _answer(
    state: SagaState, way: Settled | None, text: str, now: datetime, out: list[Outgoing]
) -> SagaState:
    """The answers that waited for this step: accepted, unless the sender said otherwise."""
    for waiting in state.awaiting:
        if not waiting.reply_to:
            continue
        refused = waiting.claimed is not None and waiting.claimed != way
        message = CommandReply(
            type="command.rejected" if refused else "command.accepted",
            saga_id=state.saga_id, order_id=state.order_id, timestamp=now,
            command_id=waiting.command_id, command_type=waiting.command_type,
            reason=(f"not applied: {text}" if refused else text),
        )  # fmt: skip
        out.append(Reply(waiting.reply_to, message, waiting.message_id or None))
    return state.evolve(awaiting=()) if state.awaiting else state


def service(step: Step) -> str:
    return step.action.split(".", 1)[0]
