"""Approval gates, pure: a saga stops before a gated step until a decision comes.

Approve continues; reject compensates; the gate's timeout does what the definition says
(compensate by default). A gate that requires a person refuses decisions from agents.
"""

from __future__ import annotations

from datetime import datetime

from saga_coordinator import machine as m
from saga_coordinator.register import Decision, SagaState, Step, gate_key
from shared.messages import ApproveSaga, DeadlineReached, RejectSaga


def stop_at_gate(state: SagaState, step: Step, now: datetime, out: list[m.Outgoing]) -> SagaState:
    step = step.model_copy(update={"gate_status": "waiting"})
    state = state.with_step(step, status="awaiting_approval", updated_at=now)
    assert step.gate is not None
    detail = (
        f"waiting for approval before {step.action}; on no decision within "
        f"{step.gate.timeout_s:g}s it will {step.gate.on_timeout}"
    )
    event = m._event(state, "saga.awaiting_approval", now, step, detail=detail)
    out.append(event.model_copy(update={"stakes": state.stakes()}))
    return state


def _waiting_step(state: SagaState) -> Step | None:
    return next((s for s in state.steps if s.gate_status == "waiting"), None)


def decide_gate(state: SagaState, command: ApproveSaga | RejectSaga, now: datetime) -> m.Transition:
    step = _waiting_step(state)
    if state.status != "awaiting_approval" or step is None or step.gate is None:
        reason = f"saga {state.saga_id} is {state.status}, not waiting at an approval gate"
        return m.Transition(state, m._reply(command, now, reason), note=reason, changed=False)
    if step.gate.require_person and command.by_kind != "person":
        reason = f"the gate before {step.action} needs a person's decision, not an agent's"
        return m.Transition(state, m._reply(command, now, reason), note=reason, changed=False)
    out: list[m.Outgoing] = list(m._reply(command, now))
    if isinstance(command, ApproveSaga):
        decision = Decision(kind="approve", note=command.note, at=now, by=command.by)
        return _approve(state, step, decision, now, out)
    decision = Decision(kind="reject", note=command.reason, at=now, by=command.by)
    why = f"rejected at the gate before {step.action}: {command.reason}"
    return _refuse(state, step, "rejected", decision, why, now, out)


def gate_timed_out(state: SagaState, message: DeadlineReached, now: datetime) -> m.Transition:
    step = _waiting_step(state)
    if (
        state.status != "awaiting_approval"
        or step is None
        or step.gate is None
        or step.index != message.step
        or message.idempotency_key != gate_key(state.saga_id, step)
    ):
        return m._ignored(state, f"stale gate deadline for step {message.step}")
    note = f"no decision within {step.gate.timeout_s:g}s"
    decision = Decision(kind="gate_timeout", note=note, at=now, by="timer")
    if step.gate.on_timeout == "approve":
        return _approve(state, step, decision, now, [])
    why = f"the gate before {step.action} timed out: {note}"
    return _refuse(state, step, "timed_out", decision, why, now, [])


def _approve(
    state: SagaState, step: Step, decision: Decision, now: datetime, out: list[m.Outgoing]
) -> m.Transition:
    step = step.model_copy(update={"gate_status": "approved"})
    state = state.with_step(
        step, status="running", decisions=(*state.decisions, decision), updated_at=now
    )
    out.append(m._event(state, "saga.approved", now, step, detail=decision.note))
    state = m._advance(state, now, out)
    return m.Transition(state, tuple(out), note=f"approved before step {step.index}")


def _refuse(
    state: SagaState,
    step: Step,
    status: str,
    decision: Decision,
    why: str,
    now: datetime,
    out: list[m.Outgoing],
) -> m.Transition:
    step = step.model_copy(update={"gate_status": status})
    state = state.with_step(step, status="running", decisions=(*state.decisions, decision))
    state = m._begin_compensation(state, why, now, out)
    state = m._advance(state, now, out)
    return m.Transition(state, tuple(out), note=why)
