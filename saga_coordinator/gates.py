"""Approval gates, pure: a saga stops before a gated step until a decision comes.

Approve continues; reject compensates; the gate's timeout does what the definition says
(compensate by default). A gate that requires a person refuses decisions from agents.
"""

from __future__ import annotations

from datetime import datetime

from saga_coordinator.authority import may_decide_gate
from saga_coordinator.progress import advance, begin_compensation
from saga_coordinator.register import Decision, GateStatus, SagaState, Step, gate_key
from saga_coordinator.transition import (
    Outgoing,
    Transition,
    decided,
    event,
    ignored,
    refuse,
    reply,
)
from saga_shared.model.messages import ApproveSaga, DeadlineReached, RejectSaga


def _waiting_step(state: SagaState) -> Step | None:
    return next((s for s in state.steps if s.gate_status == "waiting"), None)


def decide_gate(state: SagaState, command: ApproveSaga | RejectSaga, now: datetime) -> Transition:
    step = _waiting_step(state)
    if state.status != "awaiting_approval" or step is None or step.gate is None:
        reason = f"saga {state.saga_id} is {state.status}, not waiting at an approval gate"
        return refuse(state, command, now, reason)
    if command.step is not None and command.step != step.index:
        reason = (
            f"saga {state.saga_id} waits at the gate before step {step.index}, not {command.step}"
        )
        return refuse(state, command, now, reason)
    refused = may_decide_gate(step.gate.require_person, command.sender)
    if refused is not None:
        reason = f"the gate before {step.action}: {refused}"
        return refuse(state, command, now, reason, "not_permitted")
    out: list[Outgoing] = list(reply(command, now))
    if isinstance(command, ApproveSaga):
        decision = decided("approve", command.note, command, now, step.index)
        return _approve(state, step, decision, now, out)
    decision = decided("reject", command.reason, command, now, step.index)
    why = f"rejected at the gate before {step.action}: {command.reason}"
    return _refuse(state, step, "rejected", decision, why, now, out)


def gate_timed_out(state: SagaState, message: DeadlineReached, now: datetime) -> Transition:
    step = _waiting_step(state)
    if (
        state.status != "awaiting_approval"
        or step is None
        or step.gate is None
        or step.index != message.step
        or message.idempotency_key != gate_key(state.saga_id, step)
    ):
        return ignored(state, f"stale gate deadline for step {message.step}")
    note = f"no decision within {step.gate.timeout_s:g}s"
    decision = Decision(kind="gate_timeout", note=note, at=now, by="timer", step=step.index)
    if step.gate.on_timeout == "approve":
        return _approve(state, step, decision, now, [])
    why = f"the gate before {step.action} timed out: {note}"
    return _refuse(state, step, "timed_out", decision, why, now, [])


def _approve(
    state: SagaState, step: Step, decision: Decision, now: datetime, out: list[Outgoing]
) -> Transition:
    step = step.evolve(gate_status="approved")
    state = state.with_step(
        step, status="running", decisions=(*state.decisions, decision), updated_at=now
    )
    out.append(event(state, "saga.approved", now, step, detail=decision.note))
    state = advance(state, now, out)
    return Transition(state, tuple(out), note=f"approved before step {step.index}")


def _refuse(
    state: SagaState,
    step: Step,
    status: GateStatus,
    decision: Decision,
    why: str,
    now: datetime,
    out: list[Outgoing],
) -> Transition:
    step = step.evolve(gate_status=status)
    state = state.with_step(step, status="running", decisions=(*state.decisions, decision))
    state = begin_compensation(state, why, now, out)
    state = advance(state, now, out)
    return Transition(state, tuple(out), note=why)
