"""Commands sent again under a new message id, pure: every command gets an answer, however
often it is sent (design rule 12). A repeat changes nothing and hears what the first heard; a
command that reuses a saga id for something else is refused with a reply naming the conflict.

(A command sent again under the *same* message id is absorbed by the inbox and answered with
the reply the first got: ``processor.answer_again``.)
"""

from __future__ import annotations

from datetime import datetime

from saga_coordinator.register import Decision, SagaState
from saga_coordinator.transition import Reply, Transition, refuse, reply
from saga_shared.model.gateway import AdmittedPlan
from saga_shared.model.ids import random_id
from saga_shared.model.messages import (
    AbortSaga,
    AnyCommand,
    ApproveSaga,
    CommandReply,
    PartitionMessage,
    RejectSaga,
    ResolveSaga,
    ResumeSaga,
    SettleSaga,
    StartSaga,
)


def answer_again(
    message: PartitionMessage, stored: CommandReply | None, state: SagaState | None,
    now: datetime,
) -> Transition:  # fmt: skip
    """A command sent again under the id of one already handled changes nothing, and hears
    what the first heard. When the first's answer still waits for a step in flight to be
    settled (an abort), this send hears it too, then; a command handled before answers were
    kept hears where the saga stands."""
    reply_to = getattr(message, "reply_to", None)
    if reply_to is None or not message.type.startswith("saga."):
        return Transition(None)
    waiting = [a for a in (state.awaiting if state else ()) if a.message_id == message.message_id]
    if stored is None and state is not None and waiting:
        if any(a.reply_to == reply_to for a in waiting):
            return Transition(None)  # this client hears it once settled already
        also = waiting[0].model_copy(update={"reply_to": reply_to})
        later = state.evolve(awaiting=(*state.awaiting, also), updated_at=now)
        return Transition(later, (), note="answered once its step is settled")
    if stored is None:
        where = f"saga {message.saga_id} is {state.status}" if state else "no saga yet"
        stored = CommandReply(
            type="command.accepted", saga_id=message.saga_id, order_id=message.order_id,
            timestamp=now, command_id=getattr(message, "client_message_id", None)
            or message.message_id, command_type=message.type,
            reason=f"already received; {where}",
        )  # fmt: skip
    again = stored.model_copy(update={"message_id": random_id(), "timestamp": now})
    return Transition(None, (Reply(reply_to, again),))


def start_again(
    state: SagaState, command: StartSaga, plan: AdmittedPlan, now: datetime
) -> Transition:
    """A start for a saga id the register has: the same start (order, saga, parameters,
    sender) answers with where that saga stands, as a first send would; anything else is a
    conflict. The same id for another order is never that order's business: its saga is not
    touched, nor named."""
    if state.order_id != command.order_id:
        reason = f"saga id {command.saga_id} is already used for another order: choose another"
        return refuse(None, command, now, reason, "saga_id_taken")
    conflict = _differs(state, command, plan)
    if conflict:
        reason = f"saga id {command.saga_id} was already started {conflict}: choose another id"
        return refuse(state, command, now, reason, "saga_id_taken")
    note = f"already started: saga {state.saga_id} is {state.status}"
    return Transition(state, reply(command, now, note=note), note=note, changed=False)


def _differs(state: SagaState, command: StartSaga, plan: AdmittedPlan) -> str:
    owner, sender = state.started_by, command.sender
    if owner is not None and sender is not None and owner.user != sender.user:
        return "by another sender"
    if plan.saga != state.saga:
        return f"as {state.saga}, not {plan.saga}"
    was = [(s.action, dict(s.params)) for s in state.steps]
    now = [(s.action, dict(s.params)) for s in plan.steps]
    if [a for a, _ in was] != [a for a, _ in now]:
        return "with other steps"
    for (action, before), (_, after) in zip(was, now, strict=True):
        if before != after:
            names = sorted(k for k in {*before, *after} if before.get(k) != after.get(k))
            return f"with other parameters for {action} ({', '.join(names)})"
    if tuple(state.compensation_priority) != tuple(plan.compensation_priority):
        return "with another compensation priority"
    return ""


_KINDS = {
    AbortSaga: ("abort", "aborted"),
    ResumeSaga: ("resume", "resumed"),
    ResolveSaga: ("resolve", "resolved"),
    ApproveSaga: ("approve", "approved"),
    RejectSaga: ("reject", "rejected"),
}


def decided_before(state: SagaState, command: AnyCommand, now: datetime) -> Transition | None:
    """A decision the saga's state refuses, which its sender already made with the same
    words: answered as the first was (accepted), changing nothing. A second person's decision
    is not a repeat."""
    first = _first(state, command)
    if first is None:
        return None
    verb = _verb(command)
    note = (f"already {verb} by {first.by} at {first.at:%Y-%m-%d %H:%M:%S}: saga "
            f"{state.saga_id} is {state.status}")  # fmt: skip
    return Transition(state, reply(command, now, note=note), note=note, changed=False)


def _first(state: SagaState, command: AnyCommand) -> Decision | None:
    sender = command.sender
    if sender is None or isinstance(command, StartSaga):
        return None
    kind, words = _kind_and_words(command)
    for decision in state.decisions:
        same_step = getattr(command, "step", None) in (None, decision.step)
        if decision.kind == kind and decision.by == sender.user and same_step \
                and decision.note == words:  # fmt: skip
            return decision
    return None


def _kind_and_words(command: AnyCommand) -> tuple[str, str]:
    if isinstance(command, SettleSaga):
        return ("settle_happened" if command.happened else "settle_did_not_happen"), command.note
    kind, _ = _KINDS[type(command)]
    words = str(getattr(command, "reason", None) or getattr(command, "note", ""))
    return kind, words


def _verb(command: AnyCommand) -> str:
    if isinstance(command, SettleSaga):
        return "settled"
    return _KINDS[type(command)][1]
