"""The decision logic: (register, message) -> (new register, messages out). Pure, no I/O.

Every rule about what runs next lives here: forward steps in order, compensation in reverse order
of landing (declared priority first) for every step that may have landed, a failed compensation
stopping at ``needs_human``, and ``resume`` retrying only what is left.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from saga_coordinator import gates
from saga_coordinator.register import (
    Decision,
    SagaState,
    Step,
    compensation_key,
    forward_key,
)
from shared.catalog import ActionClass, Catalog
from shared.errors import PlanRejected
from shared.gateway import AdmittedPlan, admit
from shared.messages import (
    AbortSaga,
    ActionDone,
    ActionFailed,
    ActionRequest,
    ApproveSaga,
    CommandReply,
    DeadlineReached,
    EventType,
    PartitionMessage,
    RejectSaga,
    ResolveSaga,
    ResumeSaga,
    SagaEvent,
    StartSaga,
)


@dataclass(frozen=True)
class Reply:
    to: str
    message: CommandReply


Outgoing = ActionRequest | SagaEvent | Reply


@dataclass(frozen=True)
class Transition:
    state: SagaState | None  # the register to store; None when nothing is stored
    out: tuple[Outgoing, ...] = ()
    note: str = ""  # what happened, for the saga log (why a message was ignored, say)
    changed: bool = True


def decide(
    state: SagaState | None,
    message: PartitionMessage,
    catalog: Catalog,
    now: datetime,
    *,
    order_held_by: str | None = None,
) -> Transition:
    """``order_held_by``: the saga that holds the order (running, compensating or needing a
    person), if any; a new saga of the order then waits behind it."""
    if isinstance(message, StartSaga):
        if state is not None:
            return _ignored(state, f"saga {message.saga_id} already exists")
        try:
            plan = admit(catalog, message)
        except PlanRejected as exc:
            return Transition(None, _reply(message, now, str(exc)), note=f"refused: {exc}")
        return start(message, plan, now, waiting_for=order_held_by)
    if state is None:
        if isinstance(message, AbortSaga | ResumeSaga | ResolveSaga | ApproveSaga | RejectSaga):
            reason = f"no saga {message.saga_id}"
            return Transition(None, _reply(message, now, reason), note=reason, changed=False)
        return Transition(None, note=f"no saga {message.saga_id}: ignored", changed=False)
    if isinstance(message, AbortSaga):
        return abort(state, message, now)
    if isinstance(message, ResumeSaga):
        return resume(state, message, now)
    if isinstance(message, ResolveSaga):
        return resolve(state, message, now)
    if isinstance(message, ApproveSaga | RejectSaga):
        return gates.decide_gate(state, message, now)
    if isinstance(message, DeadlineReached):
        if message.phase == "gate":
            return gates.gate_timed_out(state, message, now)
        return on_deadline(state, message, now)
    if message.phase == "compensation":
        return on_compensation_outcome(state, message, now)
    return on_forward_outcome(state, message, now)


def start(
    command: StartSaga, plan: AdmittedPlan, now: datetime, *, waiting_for: str | None = None
) -> Transition:
    steps = tuple(
        Step(
            index=s.index,
            action=s.action,
            action_class=s.spec.action_class,
            params=s.params,
            timeout_s=s.forward.timeout_s,
            answer_within_s=s.forward.answer_within_s,
            max_sends=s.forward.sends,
            result_fields=s.spec.result,
            compensation=s.spec.compensation,
            compensation_timeout_s=s.compensation.timeout_s,
            compensation_answer_within_s=s.compensation.answer_within_s,
            compensation_max_sends=s.compensation.sends,
            gate=s.gate,
            residue=s.spec.residue,
        )
        for s in plan.steps
    )
    state = SagaState(
        saga_id=command.saga_id,
        order_id=command.order_id,
        saga=plan.saga,
        status="waiting",
        steps=steps,
        compensation_priority=plan.compensation_priority,
        created_at=now,
        updated_at=now,
        waiting_for=waiting_for,
    )
    if waiting_for is not None:
        detail = f"order {command.order_id} is held by saga {waiting_for}"
        out: list[Outgoing] = [
            *_reply(command, now),
            _event(state, "saga.waiting", now, detail=detail),
        ]
        return Transition(state, tuple(out), note=f"waiting for {waiting_for}")
    began = begin(state, now)
    return Transition(began.state, (*_reply(command, now), *began.out), note="started")


def begin(state: SagaState, now: datetime) -> Transition:
    """A waiting saga takes the order: its first step goes out."""
    state = state.model_copy(update={"status": "running", "waiting_for": None, "updated_at": now})
    out: list[Outgoing] = [_event(state, "saga.started", now)]
    state = _advance(state, now, out)
    return Transition(state, tuple(out), note="started")


def abort(state: SagaState, command: AbortSaga, now: datetime) -> Transition:
    if state.status == "awaiting_approval":
        state = state.model_copy(update={"status": "running"})  # stopping at a gate = aborting
    if state.status == "waiting":
        decision = Decision(kind="abort", note=command.reason, at=now, by=command.by)
        steps = tuple(s.model_copy(update={"status": "skipped"}) for s in state.steps)
        state = state.model_copy(
            update={
                "steps": steps,
                "reason": f"aborted before it started: {command.reason}",
                "decisions": (*state.decisions, decision),
                "waiting_for": None,
            }
        )
        out: list[Outgoing] = list(_reply(command, now))
        state = _finish(state, "compensated", "saga.compensated", now, out)
        return Transition(state, tuple(out), note="aborted while waiting")
    if state.status != "running":
        reason = f"saga {state.saga_id} is {state.status}; only a running saga can be aborted"
        return Transition(state, _reply(command, now, reason), note=reason, changed=False)
    decision = Decision(kind="abort", note=command.reason, at=now, by=command.by)
    out = list(_reply(command, now))
    state = state.model_copy(update={"decisions": (*state.decisions, decision)})
    state = _begin_compensation(state, f"aborted: {command.reason}", now, out)
    state = _advance(state, now, out)
    return Transition(state, tuple(out), note="aborted")


def resume(state: SagaState, command: ResumeSaga, now: datetime) -> Transition:
    if state.status != "needs_human":
        reason = f"saga {state.saga_id} is {state.status}; only needs_human can be resumed"
        return Transition(state, _reply(command, now, reason), note=reason, changed=False)
    steps = tuple(
        s.model_copy(
            update={
                "compensation_status": "pending",
                "compensation_round": s.compensation_round + 1,
            }
        )
        if s.compensation_status == "failed"
        else s
        for s in state.steps
    )
    decision = Decision(kind="resume", note=command.note, at=now, by=command.by)
    state = state.model_copy(
        update={
            "steps": steps,
            "status": "compensating",
            "needs_human_reason": None,
            "decisions": (*state.decisions, decision),
            "updated_at": now,
        }
    )
    out: list[Outgoing] = [*_reply(command, now), _event(state, "saga.resumed", now)]
    state = _advance(state, now, out)
    return Transition(state, tuple(out), note="resumed")


def resolve(state: SagaState, command: ResolveSaga, now: datetime) -> Transition:
    if state.status != "needs_human":
        reason = f"saga {state.saga_id} is {state.status}; only needs_human can be resolved"
        return Transition(state, _reply(command, now, reason), note=reason, changed=False)
    decision = Decision(kind="resolve", note=command.note, at=now, by=command.by)
    state = state.model_copy(update={"decisions": (*state.decisions, decision)})
    out: list[Outgoing] = list(_reply(command, now))
    state = _finish(state, "resolved", "saga.resolved", now, out)
    return Transition(state, tuple(out), note="resolved by a person")


def on_forward_outcome(
    state: SagaState, message: ActionDone | ActionFailed, now: datetime
) -> Transition:
    step = state.step(message.step)
    if (
        step is None
        or step.action != message.action
        or message.idempotency_key != forward_key(state.saga_id, step.action)
        or step.status != "running"
    ):
        return _ignored(state, f"stale {message.type} for step {message.step}")
    out: list[Outgoing] = []
    common = {"attempts": step.attempts + message.tries, "finished_at": now}
    if isinstance(message, ActionDone):
        # Only an action with a way back needs its identifiers: without them it cannot be undone.
        needed = step.result_fields if step.action_class.needs_compensation else ()
        missing = [f for f in needed if message.result.get(f) in (None, "")]
        if not missing:
            step = step.model_copy(
                update={
                    **common,
                    "status": "done",
                    "result": message.result,
                    "landed_seq": state.landed_count + 1,
                }
            )
            state = _land(state, step, now)
            out.append(_event(state, "step.done", now, step))
            return Transition(_advance(state, now, out), tuple(out), note=f"step {step.index} done")
        # Without the identifier its compensation needs, a "done" cannot be undone by id:
        # count it as a failure that may have landed, so the compensation looks it up by key.
        reason = f"done without {', '.join(missing)}, which the compensation needs"
        failure = {"result": message.result, "error": reason, "effect_unknown": True}
    else:
        reason = message.reason
        failure = {"error": reason, "effect_unknown": message.effect_unknown}
    return _forward_failed(state, step.model_copy(update={**common, **failure}), reason, now)


def _forward_failed(state: SagaState, step: Step, reason: str, now: datetime) -> Transition:
    out: list[Outgoing] = []
    step = step.model_copy(update={"status": "failed", "finished_at": now})
    if step.effect_unknown:
        step = step.model_copy(update={"landed_seq": state.landed_count + 1})
    state = _land(state, step, now)
    out.append(_event(state, "step.failed", now, step, detail=reason))
    if state.status == "running":
        why = f"step {step.index} {step.action} failed: {reason}"
        state = _begin_compensation(state, why, now, out)
    return Transition(_advance(state, now, out), tuple(out), note=f"step {step.index} failed")


def on_deadline(state: SagaState, message: DeadlineReached, now: datetime) -> Transition:
    """No outcome in time: send the same request again (same key, so at most one effect), or,
    after the last send, give up on it as an outcome that may have landed."""
    step = state.step(message.step)
    forward = message.phase == "forward"
    if (
        step is None
        or (forward and (step.status != "running" or message.attempt != step.sends))
        or (
            not forward
            and (
                step.compensation_status != "running" or message.attempt != step.compensation_sends
            )
        )
        or message.idempotency_key
        != (
            forward_key(state.saga_id, step.action)
            if forward
            else compensation_key(state.saga_id, step)
        )
    ):
        return _ignored(state, f"stale deadline for step {message.step}")
    sends, limit = (
        (step.sends, step.max_sends)
        if forward
        else (step.compensation_sends, step.compensation_max_sends)
    )
    if sends < limit:
        step = step.model_copy(
            update={"sends": sends + 1} if forward else {"compensation_sends": sends + 1}
        )
        state = state.with_step(step, updated_at=now)
        phase = "forward" if forward else "compensation"
        detail = f"no answer to send {sends} of {limit}: sent again"
        out: list[Outgoing] = [
            _request(state, step, phase, now),
            _event(state, "step.resent", now, step, detail=detail),
        ]
        return Transition(state, tuple(out), note=f"step {step.index} {phase} sent again")
    reason = f"no answer after {sends} send(s); the effect is unknown"
    if forward:
        step = step.model_copy(update={"error": reason, "effect_unknown": True})
        return _forward_failed(state, step, reason, now)
    return _compensation_failed(state, step, reason, step.compensation_attempts, now)


def on_compensation_outcome(
    state: SagaState, message: ActionDone | ActionFailed, now: datetime
) -> Transition:
    step = state.step(message.step)
    if (
        step is None
        or step.compensation != message.action
        or step.compensation_status != "running"
        or message.idempotency_key != compensation_key(state.saga_id, step)
    ):
        return _ignored(state, f"stale compensation {message.type} for step {message.step}")
    out: list[Outgoing] = []
    attempts = step.compensation_attempts + message.tries
    if isinstance(message, ActionDone):
        step = step.model_copy(
            update={
                "status": "compensated",
                "compensation_status": "compensated",
                "compensation_attempts": attempts,
                "compensation_result": message.result,
                "compensated_at": now,
            }
        )
        state = state.with_step(step, updated_at=now)
        out.append(_event(state, "step.compensated", now, step))
        return Transition(_advance(state, now, out), tuple(out), note=f"step {step.index} undone")
    return _compensation_failed(state, step, message.reason, attempts, now)


def _compensation_failed(
    state: SagaState, step: Step, error: str, attempts: int, now: datetime
) -> Transition:
    step = step.model_copy(
        update={
            "status": "compensation_failed",
            "compensation_status": "failed",
            "compensation_attempts": attempts,
            "compensation_error": error,
        }
    )
    reason = (
        f"compensation {step.compensation} of step {step.index} ({step.action}) failed: {error}"
    )
    state = state.with_step(step, status="needs_human", needs_human_reason=reason, updated_at=now)
    out: list[Outgoing] = [
        _event(state, "step.compensation_failed", now, step, detail=error),
        _event(state, "saga.needs_human", now, detail=reason, register=True),
    ]
    return Transition(state, tuple(out), note="needs_human")


# --- helpers ------------------------------------------------------------------------------------


def compensation_order(state: SagaState) -> list[Step]:
    """Steps still to undo: declared priority first, then reverse order of landing."""
    rank = {action: i for i, action in enumerate(state.compensation_priority)}

    def key(step: Step) -> tuple[int, int]:
        if step.action in rank:
            return (0, rank[step.action])
        return (1, -(step.landed_seq or 0))

    return sorted((s for s in state.steps if s.compensation_status == "pending"), key=key)


def _compensation_needed(step: Step) -> str:
    if not step.may_have_landed:
        return "none"
    if step.action_class is ActionClass.IRREVERSIBLE:
        return "impossible"
    if step.action_class.needs_compensation:
        return "pending"
    return "none"


def _land(state: SagaState, step: Step, now: datetime) -> SagaState:
    if state.status == "compensating":  # an abort came while this step was in flight
        step = step.model_copy(update={"compensation_status": _compensation_needed(step)})
    landed = state.landed_count + (1 if step.landed_seq is not None else 0)
    return state.with_step(step, landed_count=landed, updated_at=now)


def _begin_compensation(
    state: SagaState, reason: str, now: datetime, out: list[Outgoing]
) -> SagaState:
    steps = []
    for step in state.steps:
        if step.status == "pending":
            step = step.model_copy(update={"status": "skipped"})
        elif step.status != "running":
            step = step.model_copy(update={"compensation_status": _compensation_needed(step)})
        steps.append(step)
    state = state.model_copy(
        update={
            "steps": tuple(steps),
            "status": "compensating",
            "reason": reason,
            "updated_at": now,
        }
    )
    out.append(_event(state, "saga.compensating", now, detail=reason))
    return state


def _advance(state: SagaState, now: datetime, out: list[Outgoing]) -> SagaState:
    """Issue the next action, or finish. One action is in flight per saga at any time."""
    if any(s.status == "running" or s.compensation_status == "running" for s in state.steps):
        return state
    if state.status == "running":
        step = next((s for s in state.steps if s.status == "pending"), None)
        if step is None:
            return _finish(state, "completed", "saga.completed", now, out)
        if step.gate is not None and step.gate_status != "approved":
            return gates.stop_at_gate(state, step, now, out)
        step = step.model_copy(update={"status": "running", "started_at": now, "sends": 1})
        state = state.with_step(step, updated_at=now)
        out.append(_request(state, step, "forward", now))
        out.append(_event(state, "step.started", now, step))
        return state
    if state.status == "compensating":
        todo = compensation_order(state)
        if not todo:
            return _finish(state, "compensated", "saga.compensated", now, out)
        step = todo[0].model_copy(
            update={"compensation_status": "running", "compensation_sends": 1}
        )
        state = state.with_step(step, updated_at=now)
        out.append(_request(state, step, "compensation", now))
        out.append(_event(state, "step.compensating", now, step))
    return state


def _finish(
    state: SagaState, status: str, event: EventType, now: datetime, out: list[Outgoing]
) -> SagaState:
    state = state.model_copy(update={"status": status, "finished_at": now, "updated_at": now})
    out.append(_event(state, event, now, register=True))
    return state


def _request(state: SagaState, step: Step, phase: str, now: datetime) -> ActionRequest:
    if phase == "forward":
        action, key, timeout = step.action, forward_key(state.saga_id, step.action), step.timeout_s
        params: dict[str, Any] = dict(step.params)
    else:
        assert step.compensation is not None
        action, key = step.compensation, compensation_key(state.saga_id, step)
        timeout = step.compensation_timeout_s
        # The identifiers come from the adapter's result, never reconstructed; when the effect
        # is unknown there is no result, and the forward key lets the system find what landed.
        known = step.result or {}
        params = {f: known[f] for f in step.result_fields if known.get(f) not in (None, "")}
        params["forward_key"] = forward_key(state.saga_id, step.action)
    return ActionRequest(
        saga_id=state.saga_id,
        order_id=state.order_id,
        timestamp=now,
        action=action,
        phase="forward" if phase == "forward" else "compensation",
        step=step.index,
        idempotency_key=key,
        params=params,
        timeout_s=timeout,
        attempt=step.sends if phase == "forward" else step.compensation_sends,
    )


def _event(
    state: SagaState,
    kind: EventType,
    now: datetime,
    step: Step | None = None,
    *,
    detail: str = "",
    register: bool = False,
) -> SagaEvent:
    return SagaEvent(
        type=kind,
        saga_id=state.saga_id,
        order_id=state.order_id,
        timestamp=now,
        saga=state.saga,
        status=state.status,
        step=None if step is None else step.index,
        action=None if step is None else step.action,
        detail=detail,
        saga_register=state.register() if register else None,
    )


def _reply(
    command: StartSaga | AbortSaga | ResumeSaga | ResolveSaga | ApproveSaga | RejectSaga,
    now: datetime,
    refusal: str | None = None,
) -> tuple[Reply, ...]:
    if command.reply_to is None:
        return ()
    message = CommandReply(
        type="command.accepted" if refusal is None else "command.rejected",
        saga_id=command.saga_id,
        order_id=command.order_id,
        timestamp=now,
        command_id=command.message_id,
        command_type=command.type,
        reason=refusal or "",
    )
    return (Reply(command.reply_to, message),)


def _ignored(state: SagaState, note: str) -> Transition:
    return Transition(state, (), note=note, changed=False)
