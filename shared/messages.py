"""Every message on the bus: frozen pydantic models sharing one envelope.

Unknown fields are refused (``extra="forbid"``) so a typo in an agent's command is an error naming
the field, not a silently ignored option. ``shared.codec`` is the only place that turns these into
AMQP messages and back.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal, get_args
from uuid import uuid4

from pydantic import BaseModel, ConfigDict, Field, JsonValue, model_validator

SCHEMA_VERSION: Literal[1] = 1

Identifier = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:@-]+$")]
ActionName = Annotated[
    str, Field(min_length=3, max_length=128, pattern=r"^[a-z0-9_]+\.[a-z0-9_]+$")
]
Params = dict[Annotated[str, Field(max_length=64)], JsonValue]
Phase = Literal["forward", "compensation"]


def _now() -> datetime:
    return datetime.now(UTC)


def _new_id() -> str:
    return str(uuid4())


class Envelope(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    message_id: Identifier = Field(default_factory=_new_id)
    type: str
    saga_id: Identifier
    order_id: Identifier
    timestamp: datetime = Field(default_factory=_now)
    schema_version: Literal[1] = SCHEMA_VERSION


# --- commands: agents -> commands exchange -> intake -> partition ------------------------------


class Gate(BaseModel):
    """An approval gate before a step: the saga waits there until approved, rejected or timed
    out. Required before an irreversible action that is not last."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    timeout_s: float = Field(default=3600.0, gt=0, le=30 * 24 * 3600)
    # What the gate's timeout means: by default nobody approved, so the saga compensates.
    on_timeout: Literal["compensate", "approve"] = "compensate"
    # Approvals and rejections must come from a person (a command whose by_kind is "person").
    require_person: bool = False


class PlanStep(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    action: ActionName
    gate: Gate | None = None


class Plan(BaseModel):
    """An ad-hoc plan: the same shape as a named saga definition, checked by the same gateway."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    steps: tuple[PlanStep, ...] = Field(min_length=1, max_length=50)
    compensation_priority: tuple[ActionName, ...] = ()


class _Command(Envelope):
    reply_to: str | None = Field(default=None, max_length=255)
    # Who asked (a person's or an agent's name), for the register, and what they are. The
    # broker does not authenticate this: deployments that need it give people their own accounts.
    by: str = Field(default="", max_length=200)
    by_kind: Literal["person", "agent"] = "agent"
    # Set by the intake: the order's command number, in arrival order. The coordinator applies
    # commands of one order strictly in this order and parks any that arrive ahead of a gap.
    seq: int | None = Field(default=None, ge=1)


class StartSaga(_Command):
    type: Literal["saga.start"] = "saga.start"
    saga: Identifier | None = None
    plan: Plan | None = None
    params: Params = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_of_saga_or_plan(self) -> StartSaga:
        if (self.saga is None) == (self.plan is None):
            raise ValueError("give exactly one of 'saga' (a named definition) or 'plan'")
        return self


class AbortSaga(_Command):
    type: Literal["saga.abort"] = "saga.abort"
    reason: str = Field(min_length=1, max_length=2000)


class ResumeSaga(_Command):
    type: Literal["saga.resume"] = "saga.resume"
    note: str = Field(default="", max_length=2000)


class ResolveSaga(_Command):
    """A person takes over a saga stuck in ``needs_human``: it ends as ``resolved``."""

    type: Literal["saga.resolve"] = "saga.resolve"
    note: str = Field(min_length=1, max_length=2000)


class ApproveSaga(_Command):
    type: Literal["saga.approve"] = "saga.approve"
    note: str = Field(default="", max_length=2000)


class RejectSaga(_Command):
    type: Literal["saga.reject"] = "saga.reject"
    reason: str = Field(min_length=1, max_length=2000)


class QuerySaga(_Command):
    """Asks for a saga's register; answered by the intake from the database, changes nothing."""

    type: Literal["saga.status"] = "saga.status"


AnyCommand = StartSaga | AbortSaga | ResumeSaga | ResolveSaga | ApproveSaga | RejectSaga
Command = Annotated[AnyCommand | QuerySaga, Field(discriminator="type")]

# --- actions: coordinator -> adapters -> partition ---------------------------------------------


class ActionRequest(Envelope):
    type: Literal["action.request"] = "action.request"
    action: ActionName
    phase: Phase
    step: int = Field(ge=0)
    idempotency_key: str = Field(min_length=1, max_length=300)
    params: Params
    attempt: int = Field(default=1, ge=1)
    timeout_s: float = Field(gt=0)


class _ActionOutcome(Envelope):
    action: ActionName
    phase: Phase
    step: int = Field(ge=0)
    idempotency_key: str = Field(min_length=1, max_length=300)
    attempt: int = Field(default=1, ge=1)  # echoes the request's attempt
    tries: int = Field(default=1, ge=1)  # calls the adapter made (retries of transient errors)


class ActionDone(_ActionOutcome):
    type: Literal["action.done"] = "action.done"
    result: dict[str, JsonValue]


class ActionFailed(_ActionOutcome):
    type: Literal["action.failed"] = "action.failed"
    reason: str = Field(max_length=4000)
    # True when the call may have changed the system anyway (timeout, retries exhausted): the
    # coordinator then compensates it too, since compensations are no-ops where nothing landed.
    effect_unknown: bool


ActionOutcome = Annotated[ActionDone | ActionFailed, Field(discriminator="type")]


class DeadlineReached(Envelope):
    """The coordinator's own timer: no outcome came for this send of a request in time. It goes
    through the order's partition like everything else, so it is handled in order."""

    type: Literal["saga.deadline"] = "saga.deadline"
    step: int = Field(ge=0)
    phase: Literal["forward", "compensation", "gate"]
    idempotency_key: str = Field(min_length=1, max_length=300)
    attempt: int = Field(ge=1)


PartitionMessage = Annotated[
    StartSaga
    | AbortSaga
    | ResumeSaga
    | ResolveSaga
    | ApproveSaga
    | RejectSaga
    | ActionDone
    | ActionFailed
    | DeadlineReached,
    Field(discriminator="type"),
]

# --- out: replies to agents and public lifecycle events ----------------------------------------


class CommandReply(Envelope):
    # parked: the order is blocked (a dead letter) or a command before this one is missing; the
    # command is kept and applied, in order, once the order is unblocked.
    type: Literal["command.accepted", "command.rejected", "command.parked"]
    command_id: str
    command_type: str
    reason: str = ""
    saga_register: dict[str, Any] | None = None  # the answer to saga.status


EventType = Literal[
    "saga.started",
    "step.started",
    "step.done",
    "step.failed",
    "step.compensating",
    "step.compensated",
    "step.compensation_failed",
    "saga.compensating",
    "saga.completed",
    "saga.compensated",
    "saga.needs_human",
    "saga.resumed",
    "saga.waiting",
    "saga.resolved",
    "step.resent",
    "saga.awaiting_approval",
    "saga.approved",
]
EVENT_TYPES: tuple[str, ...] = get_args(EventType)


class SagaEvent(Envelope):
    """Public lifecycle event, routed on the events topic exchange by its ``type``."""

    type: EventType
    saga: str
    status: str
    step: int | None = None
    action: str | None = None
    detail: str = ""
    # The whole register, carried by alerts (``saga.needs_human``) and terminal events.
    saga_register: dict[str, Any] | None = None
    # At a gate: what is at stake (actions still to run, which cannot be undone, what
    # compensating now would cost).
    stakes: dict[str, Any] | None = None
