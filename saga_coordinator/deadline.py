"""Which deadline a saga has after a transition: a pure decision (the processor stores it).

Rule 1 of the design (docs/explanation/design.md: a saga never waits for ever) rests on it:
whenever a request is out, a
deadline for that very send is armed; while the saga waits at a gate, the gate's time-out is;
with nothing in flight, none is. The timer turns a due deadline into a ``saga.deadline``
message that goes through the order's partition like any other.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from saga_coordinator.register import SagaState, gate_key
from saga_coordinator.transition import Transition
from saga_shared.model.messages import ActionRequest, SettleRequest


@dataclass(frozen=True)
class Arm:
    step: int
    phase: Literal["forward", "compensation", "gate", "settle"]
    idempotency_key: str
    attempt: int
    due_at: datetime


@dataclass(frozen=True)
class Disarm:
    pass


# None: the transition changes nothing about the saga's deadline.
DeadlineChange = Arm | Disarm | None


def after(state: SagaState, transition: Transition, now: datetime) -> DeadlineChange:
    """The deadline ``state`` needs once ``transition`` (which produced it) is stored."""
    requests = [m for m in transition.out if isinstance(m, ActionRequest | SettleRequest)]
    if requests:
        req = requests[-1]
        step = state.steps[req.step]
        if isinstance(req, SettleRequest):  # a settle is answered from a key record: as fast
            due = now + timedelta(seconds=step.answer_within_s)
            return Arm(req.step, "settle", req.idempotency_key, req.attempt, due)
        wait = step.answer_within_s if req.phase == "forward" else step.compensation_answer_within_s
        return Arm(
            req.step, req.phase, req.idempotency_key, req.attempt, now + timedelta(seconds=wait)
        )
    gated = next((s for s in state.steps if s.gate_status == "waiting"), None)
    if state.status == "awaiting_approval" and gated is not None and gated.gate is not None:
        due = now + timedelta(seconds=gated.gate.timeout_s)
        return Arm(gated.index, "gate", gate_key(state.saga_id, gated), 1, due)
    if not any(s.in_flight for s in state.steps):
        return Disarm()
    return None  # a request is still out from before: its deadline stands
