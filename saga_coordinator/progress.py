"""How a saga moves on: the next action, compensation in its order, the end. Pure."""

from __future__ import annotations

from datetime import datetime

from saga_coordinator.register import CompensationStatus, Decision, SagaState, SagaStatus, Step
from saga_coordinator.transition import Outgoing, event, request
from saga_shared.model.catalog import ActionClass
from saga_shared.model.messages import EventType


def compensation_order(state: SagaState) -> list[Step]:
    """Steps still to undo: declared priority first, then reverse order of landing."""
    rank = {action: i for i, action in enumerate(state.compensation_priority)}

    def key(step: Step) -> tuple[int, int]:
        if step.action in rank:
            return (0, rank[step.action])
        return (1, -(step.landed_seq or 0))

    return sorted((s for s in state.steps if s.compensation_status == "pending"), key=key)


def compensation_needed(step: Step) -> CompensationStatus:
    if not step.may_have_landed:
        return "none"
    if step.action_class is ActionClass.IRREVERSIBLE:
        return "impossible"
    if step.action_class.needs_compensation:
        return "pending"
    return "none"


def abort_overtaken(state: SagaState, step: Step, now: datetime) -> SagaState:
    """An abort came while the last step, irreversible, was in flight, and it has landed: it
    cannot be undone, so undoing the steps before it would leave the customer with, say, a
    refund e-mail for a refund taken back. The abort is void and the saga completes (no
    compensation has run: one action is in flight at a time). With steps still to come after
    such a step, the abort stands: nothing more runs forward, and the step is a residue."""
    steps = tuple(s.evolve(compensation_status="none") for s in state.steps)
    note = f"{step.action} (irreversible) landed before the abort could stop it"
    void = Decision(kind="abort_overtaken", note=note, at=now, by="coordinator")
    return state.evolve(steps=steps, status="running", reason=None, updated_at=now,
                        decisions=(*state.decisions, void))  # fmt: skip


def land(state: SagaState, step: Step, now: datetime) -> SagaState:
    if state.status == "compensating":  # an abort came while this step was in flight
        step = step.evolve(compensation_status=compensation_needed(step))
    landed = state.landed_count + (1 if step.landed_seq is not None else 0)
    return state.with_step(step, landed_count=landed, updated_at=now)


def begin_compensation(
    state: SagaState, reason: str, now: datetime, out: list[Outgoing]
) -> SagaState:
    steps = []
    for step in state.steps:
        if step.status == "pending":
            step = step.evolve(status="skipped")
        elif step.status not in ("running", "in_doubt"):  # decided once they are settled
            step = step.evolve(compensation_status=compensation_needed(step))
        steps.append(step)
    state = state.evolve(steps=tuple(steps), status="compensating", reason=reason, updated_at=now)
    out.append(event(state, "saga.compensating", now, detail=reason))
    return state


def advance(state: SagaState, now: datetime, out: list[Outgoing]) -> SagaState:
    """Issue the next action, or finish. One action is in flight per saga at any time, and
    nothing moves while a step is in doubt (design rule 2)."""
    if any(s.in_flight or s.status == "in_doubt" for s in state.steps):
        return state
    if state.status == "running":
        step = next((s for s in state.steps if s.status == "pending"), None)
        if step is None:
            return finish(state, "completed", "saga.completed", now, out)
        if step.gate is not None and step.gate_status != "approved":
            return stop_at_gate(state, step, now, out)
        step = step.evolve(status="running", started_at=now, sends=1)
        state = state.with_step(step, updated_at=now)
        out.append(request(state, step, "forward", now))
        out.append(event(state, "step.started", now, step))
        return state
    if state.status == "compensating":
        todo = compensation_order(state)
        if not todo:
            return finish(state, "compensated", "saga.compensated", now, out)
        step = todo[0].evolve(compensation_status="running", compensation_sends=1)
        state = state.with_step(step, updated_at=now)
        out.append(request(state, step, "compensation", now))
        out.append(event(state, "step.compensating", now, step))
    return state


def finish(
    state: SagaState, status: SagaStatus, kind: EventType, now: datetime, out: list[Outgoing]
) -> SagaState:
    state = state.evolve(status=status, finished_at=now, updated_at=now)
    out.append(event(state, kind, now, register=True))
    return state


def stop_at_gate(state: SagaState, step: Step, now: datetime, out: list[Outgoing]) -> SagaState:
    step = step.evolve(gate_status="waiting")
    state = state.with_step(step, status="awaiting_approval", updated_at=now)
    assert step.gate is not None
    detail = (
        f"waiting for approval before {step.action}; on no decision within "
        f"{step.gate.timeout_s:g}s it will {step.gate.on_timeout}"
    )
    out.append(event(state, "saga.awaiting_approval", now, step, detail=detail,
                     stakes=state.stakes()))  # fmt: skip
    return state
