"""The decision logic: (register, message) -> (new register, messages out). Pure, no I/O.

Every rule about what runs next lives here: forward steps in order, compensation in reverse order
of landing (declared priority first) for every step that may have landed, a failed compensation
stopping at ``needs_human``, and ``resume`` retrying only what is left.
"""

from __future__ import annotations

from datetime import datetime

from saga_coordinator import doubt, gates, lost, repeats
from saga_coordinator.authority import may_act
from saga_coordinator.progress import (
    abort_overtaken,
    advance,
    begin_compensation,
    finish,
    land,
)
from saga_coordinator.register import (
    SagaState,
    Step,
    StepChanges,
    compensation_key,
    forward_key,
)
from saga_coordinator.transition import (
    Outgoing,
    Transition,
    decided,
    event,
    ignored,
    refuse,
    reply,
    request,
)
from saga_shared.errors import PlanRejected
from saga_shared.model.catalog import ActionClass, Catalog
from saga_shared.model.gateway import AdmittedPlan, admit
from saga_shared.model.messages import (
    AbortSaga,
    ActionDone,
    ActionFailed,
    ActionSettled,
    ApproveSaga,
    DeadlineReached,
    PartitionMessage,
    Phase,
    RejectSaga,
    ResolveSaga,
    ResumeSaga,
    SettleSaga,
    StartSaga,
)

_DECISIONS = AbortSaga | ResumeSaga | ResolveSaga | ApproveSaga | RejectSaga | SettleSaga


def decide(
    state: SagaState | None,
    message: PartitionMessage,
    catalog: Catalog,
    now: datetime,
    *,
    order_held_by: str | None = None,
    admitted: AdmittedPlan | None = None,
) -> Transition:
    """``order_held_by``: the saga that holds the order (running, compensating or needing a
    person), if any; a new saga of the order then waits behind it. ``admitted``: what
    ``admit(catalog, message)`` returned for this start, when the caller has it already."""
    if isinstance(message, StartSaga):
        try:
            plan = admitted if admitted is not None else admit(catalog, message)
        except PlanRejected as exc:
            return refuse(None, message, now, str(exc), exc.rule)
        if state is not None:  # sent again, or the id reused for something else
            return repeats.start_again(state, message, plan, now)
        return start(message, plan, now, waiting_for=order_held_by)
    if state is None:
        if isinstance(message, _DECISIONS):
            reason = f"no saga {message.saga_id}"
            return refuse(None, message, now, reason, "no_saga")
        return Transition(None, note=f"no saga {message.saga_id}: ignored", changed=False)
    if isinstance(message, _DECISIONS):
        refused = may_act(state, message.type, message.sender)
        if refused is not None:
            return refuse(state, message, now, refused, "not_permitted")
        decision = _decide(state, message, now)
        if decision.refused is not None and decision.rule == "saga_state":
            return repeats.decided_before(state, message, now) or decision
        return decision
    if isinstance(message, ActionSettled):
        return doubt.on_settled(state, message, now)
    if isinstance(message, DeadlineReached):
        if message.phase == "gate":
            return gates.gate_timed_out(state, message, now)
        if message.phase == "settle":
            return doubt.on_deadline(state, message, now)
        return on_deadline(state, message, now)
    if message.phase == "compensation":
        return on_compensation_outcome(state, message, now)
    return on_forward_outcome(state, message, now)


def _decide(state: SagaState, message: _DECISIONS, now: datetime) -> Transition:
    """A person's, an operator's or an agent's decision about a saga."""
    if isinstance(message, AbortSaga):
        return abort(state, message, now)
    if isinstance(message, ResumeSaga):
        return resume(state, message, now)
    if isinstance(message, ResolveSaga):
        return resolve(state, message, now)
    if isinstance(message, ApproveSaga | RejectSaga):
        return gates.decide_gate(state, message, now)
    return doubt.person_settles(state, message, now)


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
        started_by=command.sender,
    )
    if waiting_for is not None:
        detail = f"order {command.order_id} is held by saga {waiting_for}"
        out: list[Outgoing] = [
            *reply(command, now),
            event(state, "saga.waiting", now, detail=detail),
        ]
        return Transition(state, tuple(out), note=f"waiting for {waiting_for}")
    began = begin(state, now)
    return Transition(began.state, (*reply(command, now), *began.out), note="started")


def begin(state: SagaState, now: datetime) -> Transition:
    """A waiting saga takes the order: its first step goes out."""
    state = state.evolve(status="running", waiting_for=None, updated_at=now)
    out: list[Outgoing] = [event(state, "saga.started", now)]
    state = advance(state, now, out)
    return Transition(state, tuple(out), note="started")


def abort(state: SagaState, command: AbortSaga, now: datetime) -> Transition:
    if state.status == "awaiting_approval":
        state = state.evolve(status="running")  # stopping at a gate = aborting
    if state.status == "waiting":
        decision = decided("abort", command.reason, command, now)
        steps = tuple(s.evolve(status="skipped") for s in state.steps)
        state = state.evolve(
            steps=steps,
            reason=f"aborted before it started: {command.reason}",
            decisions=(*state.decisions, decision),
            waiting_for=None,
        )
        out: list[Outgoing] = list(reply(command, now))
        state = finish(state, "compensated", "saga.compensated", now, out)
        return Transition(state, tuple(out), note="aborted while waiting")
    if state.status != "running":
        reason = f"saga {state.saga_id} is {state.status}; only a running saga can be aborted"
        return refuse(state, command, now, reason)
    decision = decided("abort", command.reason, command, now)
    # An irreversible step out now is settled first; the answer says which way it went.
    state, waits = doubt.abort_in_flight(state, command, now)
    out = [] if waits else list(reply(command, now))
    state = state.evolve(decisions=(*state.decisions, decision))
    state = begin_compensation(state, f"aborted: {command.reason}", now, out)
    for step in state.steps:
        if step.status == "running" and step.action_class is ActionClass.IRREVERSIBLE:
            state = doubt.settle_first(state, step, now, out)
    state = advance(state, now, out)
    return Transition(state, tuple(out), note="aborted" + (": settling first" if waits else ""))


def resume(state: SagaState, command: ResumeSaga, now: datetime) -> Transition:
    if state.status != "needs_human":
        reason = f"saga {state.saga_id} is {state.status}; only needs_human can be resumed"
        return refuse(state, command, now, reason)
    if any(s.status == "in_doubt" for s in state.steps):  # ask the step's service again
        decision = decided("resume", command.note, command, now)
        state = state.evolve(decisions=(*state.decisions, decision), updated_at=now)
        out: list[Outgoing] = [*reply(command, now), event(state, "saga.resumed", now)]
        state = doubt.resettle(state, now, out)
        return Transition(state, tuple(out), note="resumed: settling again")
    steps = tuple(
        s.evolve(compensation_status="pending", compensation_round=s.compensation_round + 1)
        if s.compensation_status == "failed"
        else s
        for s in state.steps
    )
    decision = decided("resume", command.note, command, now)
    state = state.evolve(
        steps=steps,
        status="compensating",
        needs_human_reason=None,
        decisions=(*state.decisions, decision),
        updated_at=now,
    )
    out = [*reply(command, now), event(state, "saga.resumed", now)]
    state = advance(state, now, out)
    return Transition(state, tuple(out), note="resumed")


def resolve(state: SagaState, command: ResolveSaga, now: datetime) -> Transition:
    if state.status != "needs_human":
        reason = f"saga {state.saga_id} is {state.status}; only needs_human can be resolved"
        return refuse(state, command, now, reason)
    decision = decided("resolve", command.note, command, now)
    state = state.evolve(decisions=(*state.decisions, decision))
    out: list[Outgoing] = list(reply(command, now))
    state = finish(state, "resolved", "saga.resolved", now, out)
    return Transition(state, tuple(out), note="resolved by a person")


def on_forward_outcome(
    state: SagaState, message: ActionDone | ActionFailed, now: datetime
) -> Transition:
    step = state.step(message.step)
    if (
        step is None
        or step.action != message.action
        or message.idempotency_key != forward_key(state.saga_id, step.action)
        or step.status not in ("running", "in_doubt")
    ):
        return ignored(state, f"stale {message.type} for step {message.step}")
    if step.status == "in_doubt" or step.settling:
        return doubt.outcome_while_settling(state, step, message, now)
    out: list[Outgoing] = []
    common: StepChanges = {"attempts": step.attempts + message.tries, "finished_at": now}
    if isinstance(message, ActionDone):
        # Only an action with a way back needs its identifiers: without them it cannot be undone.
        needed = step.result_fields if step.action_class.needs_compensation else ()
        missing = [f for f in needed if message.result.get(f) in (None, "")]
        if not missing:
            step = step.evolve(**common).evolve(
                status="done", result=message.result, landed_seq=state.landed_count + 1
            )
            if (
                state.status == "compensating"
                and step.action_class is ActionClass.IRREVERSIBLE
                and all(s.status != "skipped" for s in state.steps)
            ):  # the abort came while the last step, irreversible, was in flight
                state = abort_overtaken(state, step, now)
            state = land(state, step, now)
            out.append(event(state, "step.done", now, step))
            return Transition(advance(state, now, out), tuple(out), note=f"step {step.index} done")
        # Without the identifier its compensation needs, a "done" cannot be undone by id:
        # count it as a failure that may have landed, so the compensation looks it up by key.
        reason = f"done without {', '.join(missing)}, which the compensation needs"
        failure: StepChanges = {"result": message.result, "error": reason, "effect_unknown": True}
    else:
        reason = message.reason
        failure = {"error": reason, "effect_unknown": message.effect_unknown}
    return _forward_failed(state, step.evolve(**common).evolve(**failure), reason, now)


def _forward_failed(state: SagaState, step: Step, reason: str, now: datetime) -> Transition:
    if step.effect_unknown and step.action_class is ActionClass.IRREVERSIBLE:
        return doubt.into_doubt(state, step, reason, now)  # nothing acts around it until settled
    out: list[Outgoing] = []
    step = step.evolve(status="failed", finished_at=now)
    if step.effect_unknown:
        step = step.evolve(landed_seq=state.landed_count + 1)
    state = land(state, step, now)
    out.append(event(state, "step.failed", now, step, detail=reason))
    if state.status == "running":
        why = f"step {step.index} {step.action} failed: {reason}"
        state = begin_compensation(state, why, now, out)
    return Transition(advance(state, now, out), tuple(out), note=f"step {step.index} failed")


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
        return ignored(state, f"stale deadline for step {message.step}")
    if message.lost is not None:
        return lost.resend_lost(state, step, forward, message.lost, now)
    sends, limit = (
        (step.sends, step.max_sends)
        if forward
        else (step.compensation_sends, step.compensation_max_sends)
    )
    if sends < limit:
        step = (
            step.evolve(sends=sends + 1) if forward else step.evolve(compensation_sends=sends + 1)
        )
        state = state.with_step(step, updated_at=now)
        phase: Phase = "forward" if forward else "compensation"
        detail = f"no answer to send {sends} of {limit}: sent again"
        out: list[Outgoing] = [
            request(state, step, phase, now),
            event(state, "step.resent", now, step, detail=detail),
        ]
        return Transition(state, tuple(out), note=f"step {step.index} {phase} sent again")
    reason = f"no answer after {sends} send(s); the effect is unknown"
    if forward:
        step = step.evolve(error=reason, effect_unknown=True)
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
        return ignored(state, f"stale compensation {message.type} for step {message.step}")
    out: list[Outgoing] = []
    attempts = step.compensation_attempts + message.tries
    step = _forward_settled_by(step, message)
    if isinstance(message, ActionDone):
        step = step.evolve(
            status="compensated",
            compensation_status="compensated",
            compensation_attempts=attempts,
            compensation_result=message.result,
            compensated_at=now,
        )
        state = state.with_step(step, updated_at=now)
        out.append(event(state, "step.compensated", now, step))
        return Transition(advance(state, now, out), tuple(out), note=f"step {step.index} undone")
    return _compensation_failed(state, step, message.reason, attempts, now)


def _forward_settled_by(step: Step, message: ActionDone | ActionFailed) -> Step:
    """A compensable step in doubt is settled by its compensation, which fences its forward key
    when it never ran: the register keeps which way it went."""
    if not step.effect_unknown or step.settled is not None or message.forward is None:
        return step
    if message.forward == "done":
        return step.evolve(settled="happened", settled_by=f"{step.compensation} (its key record)")
    if message.forward in ("fenced", "failed"):
        return step.evolve(
            settled="did_not_happen", settled_by=f"{step.compensation} (its key record)"
        )
    return step


def _compensation_failed(
    state: SagaState, step: Step, error: str, attempts: int, now: datetime
) -> Transition:
    step = step.evolve(
        status="compensation_failed",
        compensation_status="failed",
        compensation_attempts=attempts,
        compensation_error=error,
    )
    reason = (
        f"compensation {step.compensation} of step {step.index} ({step.action}) failed: {error}"
    )
    state = state.with_step(step, status="needs_human", needs_human_reason=reason, updated_at=now)
    out: list[Outgoing] = [
        event(state, "step.compensation_failed", now, step, detail=error),
        event(state, "saga.needs_human", now, detail=reason, register=True),
    ]
    return Transition(state, tuple(out), note="needs_human")


# --- helpers ------------------------------------------------------------------------------------
