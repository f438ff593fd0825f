"""Every message on the bus: frozen pydantic models sharing one envelope.

Unknown fields are refused (``extra="forbid"``) so a typo in an agent's command is an error naming
the field, not a silently ignored option. ``saga_shared.transport.codec`` is the only place that
turns these into AMQP messages and back."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from functools import partial
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, JsonValue, StringConstraints, model_validator

from saga_shared.model.ids import random_id

SCHEMA_VERSION: Literal[1] = 1

Identifier = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:@-]+$")]
ActionName = Annotated[
    str, Field(min_length=3, max_length=128, pattern=r"^[a-z0-9_]+\.[a-z0-9_]+$")
]
ServiceName = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[a-z0-9_]+$")]
ParamName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
Params = Annotated[dict[ParamName, JsonValue], Field(max_length=64)]
IdempotencyKey = Annotated[str, Field(min_length=1, max_length=300, pattern=r"^[A-Za-z0-9_.:@-]+$")]
Phase = Literal["forward", "compensation"]
# Who sent a message, as the broker vouched for it (the AMQP user_id it checked against the
# connection's user) and as the deployment's directory of users names their role.
Role = Literal[
    "coordinator", "inventory", "erp", "payments", "email", "ops", "console", "agent", "person"
]
Count = Annotated[int, Field(ge=1, le=10_000)]
# Why, for the register: a person's words, never blank.
Reason = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=2000)]
Note = Annotated[str, StringConstraints(strip_whitespace=True, max_length=2000)]
# Why a message died, as the dead letters record it (delivery_limit, rejected, forged, ...).
DeathReason = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[a-z][a-z0-9_-]*$")]


# What stamps a message built without a timestamp: the wall clock, but for the deterministic
# simulation (``stamped_by``), whose clock is virtual.
_clock: Callable[[], datetime] = partial(datetime.now, UTC)


def _now() -> datetime:
    return _clock()


@contextlib.contextmanager
def stamped_by(clock: Callable[[], datetime]) -> Iterator[None]:
    """Messages built while open take their timestamps from ``clock``."""
    global _clock
    before, _clock = _clock, clock
    try:
        yield
    finally:
        _clock = before


class Envelope(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    message_id: Identifier = Field(default_factory=random_id)
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
    # Who may decide: a person's own account, or (false) also an operations account. An agent
    # never decides at a gate: a gate it could open itself would guard nothing.
    require_person: bool = True


class PlanStep(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    action: ActionName
    gate: Gate | None = None


class Plan(BaseModel):
    """An ad-hoc plan: the same shape as a named saga definition, checked by the same gateway."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    steps: tuple[PlanStep, ...] = Field(min_length=1, max_length=50)
    compensation_priority: tuple[ActionName, ...] = ()


class Sender(BaseModel):
    """The verified sender of a command: set by the intake from the broker's user_id, never
    taken from what a client wrote."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    user: Identifier
    role: Role
    # The account that vouched for ``user`` when it is not the publisher itself: the console,
    # which signs people in and sends their decisions from its own broker account.
    via: Identifier | None = None

    @property
    def acting_as(self) -> str:
        """The role as the register shows it: ``person via saga-console``."""
        return f"{self.role} via {self.via}" if self.via else self.role


class _Command(Envelope):
    reply_to: str | None = Field(
        default=None, min_length=1, max_length=255, pattern=r"^[A-Za-z0-9_.:@-]+$"
    )
    # Set by the intake, never by a client: who sent the command (verified by the broker) and
    # the order's command number, in arrival order. The coordinator applies commands of one
    # order strictly in this order and parks any that arrive ahead of a gap.
    sender: Sender | None = None
    seq: int | None = Field(default=None, ge=1, le=2**62)
    # The id the client gave the command: replies name it. The intake forwards the command under
    # an id of its own, derived from the sender and this one, so no client can choose an id
    # that another message of the system (another agent's command, a service's outcome) uses.
    client_message_id: Identifier | None = None


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
    reason: Reason


class ResumeSaga(_Command):
    type: Literal["saga.resume"] = "saga.resume"
    note: Note = ""


class ResolveSaga(_Command):
    """A person takes over a saga stuck in ``needs_human``: it ends as ``resolved``."""

    type: Literal["saga.resolve"] = "saga.resolve"
    note: Reason


class ApproveSaga(_Command):
    type: Literal["saga.approve"] = "saga.approve"
    note: Note = ""
    # The gate decided on (its step), as read from the register: a decision sent again after
    # the saga moved on to its next gate is then a repeat, never a decision on that gate.
    step: int | None = Field(default=None, ge=0, le=999)


class RejectSaga(_Command):
    type: Literal["saga.reject"] = "saga.reject"
    reason: Reason
    step: int | None = Field(default=None, ge=0, le=999)


class SettleSaga(_Command):
    """A person settles a step in doubt (its outcome unknown): it happened, or it did not.
    "Did not happen" takes effect only once the step's service has fenced its key (the service
    refuses while a claim on it is live); ``version`` is the register version the person
    decided on, so an answer that got there first wins and the person is told."""

    type: Literal["saga.settle"] = "saga.settle"
    step: int = Field(ge=0, le=999)
    happened: bool
    note: Reason
    version: int | None = Field(default=None, ge=0, le=2**62)


class QuerySaga(_Command):
    """Asks for a saga's register; answered by the intake from the database, changes nothing."""

    type: Literal["saga.status"] = "saga.status"


AnyCommand = (
    StartSaga | AbortSaga | ResumeSaga | ResolveSaga | ApproveSaga | RejectSaga | SettleSaga
)


# --- the operators' desk: dead letters, handled by the intake at once (not per order) ----------


class _DeskCommand(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    message_id: Identifier = Field(default_factory=random_id)
    type: str
    timestamp: datetime = Field(default_factory=_now)
    schema_version: Literal[1] = SCHEMA_VERSION
    reply_to: str | None = Field(
        default=None, min_length=1, max_length=255, pattern=r"^[A-Za-z0-9_.:@-]+$"
    )
    sender: Sender | None = None  # set by the intake


class ReplayDeadLetters(_DeskCommand):
    """Republish dead letters to where they were first headed: one, an order's, those that
    died for one reason (``delivery_limit``...), or all; each order's in its publish order."""

    type: Literal["dlq.replay"] = "dlq.replay"
    dead_letter_id: int | None = Field(default=None, ge=1, le=2**62)
    order_id: Identifier | None = None
    death_reason: DeathReason | None = None
    all: bool = False
    note: Note = ""

    @model_validator(mode="after")
    def _one_target(self) -> ReplayDeadLetters:
        targets = (self.dead_letter_id, self.order_id, self.death_reason)
        if sum(t is not None for t in targets) + self.all != 1:
            raise ValueError(
                "give exactly one of 'dead_letter_id', 'order_id', 'death_reason' or 'all'"
            )
        return self


class DiscardDeadLetter(_DeskCommand):
    """Give up on a dead letter; what that means for its saga depends on what it was."""

    type: Literal["dlq.discard"] = "dlq.discard"
    dead_letter_id: int = Field(ge=1, le=2**62)
    reason: Reason


DeskCommand = ReplayDeadLetters | DiscardDeadLetter
Command = Annotated[AnyCommand | QuerySaga | DeskCommand, Field(discriminator="type")]

# --- actions: coordinator -> adapters -> partition ---------------------------------------------


class ActionRequest(Envelope):
    type: Literal["action.request"] = "action.request"
    action: ActionName
    phase: Phase
    step: int = Field(ge=0, le=999)
    idempotency_key: IdempotencyKey
    params: Params
    attempt: Count = 1
    timeout_s: float = Field(gt=0, le=3600)


# What a service's key record says of a key, in answer to a settle: ``done`` / ``failed`` its
# stored outcome; ``fenced`` never claimed (or abandoned where that is safe), and now refused to
# every later call; ``running`` claimed by a live call; ``in_doubt`` claimed, unfinished, and
# the service cannot tell (no status hook, or it does not know).
SettleVerdict = Literal["done", "failed", "fenced", "running", "in_doubt"]


class _ActionOutcome(Envelope):
    action: ActionName
    phase: Phase
    step: int = Field(ge=0, le=999)
    idempotency_key: IdempotencyKey
    attempt: Count = 1  # echoes the request's attempt
    tries: Count = 1  # calls the adapter made (retries of transient errors)
    # A compensation's: what the service's key record said of the forward key when the
    # compensation ran (it fences a key never claimed), so the register knows which way a
    # forward call in doubt went. None: the service did not say.
    forward: SettleVerdict | None = None


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


class SettleRequest(Envelope):
    """The coordinator asks the service that owns ``action`` which way ``idempotency_key``
    went, with the same atomic insert-if-absent its calls claim keys with: a key never claimed
    is fenced for ever. Goes to the service's action queue, like a request."""

    type: Literal["action.settle"] = "action.settle"
    action: ActionName
    step: int = Field(ge=0, le=999)
    idempotency_key: IdempotencyKey
    attempt: Count = 1  # this settle's send number
    # A person said it did not happen: a claim whose lease has expired may be fenced too, if
    # no call has claimed the key since ``fence_claims`` claims (those the person knew of).
    fence_expired: bool = False
    fence_claims: int = Field(default=0, ge=0, le=1_000_000)


class ActionSettled(Envelope):
    """A service's answer to a settle, into the order's partition like an outcome."""

    type: Literal["action.settled"] = "action.settled"
    action: ActionName
    step: int = Field(ge=0, le=999)
    idempotency_key: IdempotencyKey
    attempt: Count = 1  # echoes the settle's
    verdict: SettleVerdict
    result: dict[str, JsonValue] | None = None  # done: the stored result
    reason: str = Field(default="", max_length=4000)
    # failed: whether the stored failure may have landed anyway.
    effect_unknown: bool = False
    lease_s: float | None = Field(default=None, ge=0, le=86_400)  # running: the claim's rest
    claims: int | None = Field(default=None, ge=0, le=1_000_000)  # calls that claimed the key


class DeadlineReached(Envelope):
    """The coordinator's own timer: no outcome came for this send of a request in time. It goes
    through the order's partition like everything else, so it is handled in order."""

    type: Literal["saga.deadline"] = "saga.deadline"
    step: int = Field(ge=0, le=999)
    phase: Literal["forward", "compensation", "gate", "settle"]
    idempotency_key: IdempotencyKey
    attempt: Count
    # Not a deadline: this service's request queue was found gone (with its node, a broker
    # restart), and this send may have gone with it. Sent again at once, not counted against
    # the step's sends (saga_coordinator.lost).
    lost: ServiceName | None = None


PartitionMessage = Annotated[
    StartSaga
    | AbortSaga
    | ResumeSaga
    | ResolveSaga
    | ApproveSaga
    | RejectSaga
    | SettleSaga
    | ActionDone
    | ActionFailed
    | ActionSettled
    | DeadlineReached,
    Field(discriminator="type"),
]

# --- out: replies to agents and public lifecycle events ----------------------------------------


class DeskReply(BaseModel):
    """The answer to a desk command: what was done with each dead letter."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    message_id: Identifier = Field(default_factory=random_id)
    type: Literal["desk.done", "desk.refused"]
    timestamp: datetime = Field(default_factory=_now)
    command_id: str = Field(max_length=128)
    command_type: str = Field(max_length=64)
    reason: str = Field(default="", max_length=4000)
    results: tuple[dict[str, JsonValue], ...] = ()


class Alert(BaseModel):
    """Published on the events exchange under ``alert.<kind>``: something an operator must
    look at that belongs to no saga (a forged message, a dead letter that could not be stored)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    message_id: Identifier = Field(default_factory=random_id)
    type: Literal["alert.forged", "alert.unstorable", "alert.rate_limited"]
    timestamp: datetime = Field(default_factory=_now)
    detail: str = Field(max_length=4000)
    dead_letter_id: int | None = None
    sender: str | None = Field(default=None, max_length=128)
    order_id: Identifier | None = None


class CommandReply(Envelope):
    # parked: the order is blocked (a dead letter) or a command before this one is missing; the
    # command is kept and applied, in order, once the order is unblocked.
    type: Literal["command.accepted", "command.rejected", "command.parked"]
    command_id: str = Field(max_length=128)
    command_type: str = Field(max_length=64)
    reason: str = Field(default="", max_length=4000)
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
    "step.in_doubt",
    "step.settled",
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


# Whatever a component publishes: a message of a saga, a desk's answer, or an alert.
Outbound = Envelope | DeskReply | Alert | ReplayDeadLetters | DiscardDeadLetter
