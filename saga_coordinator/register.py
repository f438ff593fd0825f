"""The register: the durable record of one saga and each of its actions.

Stored as JSON in ``sagas.state``; read by operators (``saga show``) and carried by alerts. The
admitted plan is snapshotted into each step so that a catalog edit never alters a running saga.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, Self, TypedDict

from pydantic import BaseModel, ConfigDict, Field, JsonValue
from typing_extensions import Unpack

from saga_shared.model.catalog import ActionClass
from saga_shared.model.messages import Gate, Sender

SagaStatus = Literal[
    "waiting",
    "running",
    "awaiting_approval",
    "compensating",
    "completed",
    "compensated",
    "needs_human",
    "resolved",
]
GateStatus = Literal["none", "waiting", "approved", "rejected", "timed_out"]
# in_doubt: an irreversible step whose outcome is unknown (its last deadline passed, its
# service said it may have landed): settled by its service's key record or by a person before
# anything acts on it.
StepStatus = Literal[
    "pending", "running", "done", "failed", "compensated", "compensation_failed", "skipped",
    "in_doubt",
]  # fmt: skip
# Which way a step whose outcome was unknown went, once known.
Settled = Literal["happened", "did_not_happen"]
# none: nothing to undo (never landed, or read-only); pending/running/compensated/failed: the
# compensation's own lifecycle; impossible: an irreversible action that landed.
CompensationStatus = Literal["none", "pending", "running", "compensated", "failed", "impossible"]

TERMINAL: frozenset[str] = frozenset({"completed", "compensated", "resolved"})
# A saga in one of these holds its order: later sagas of the order wait behind it.
HOLDS_ORDER: frozenset[str] = frozenset(
    {"running", "awaiting_approval", "compensating", "needs_human"}
)


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    def _with(self, changes: dict[str, Any]) -> Self:
        """``model_copy(update=changes)``, which it equals, without its generic ``copy()`` of
        three dictionaries: these models have no extra fields and no private attributes, and
        every decision copies the register and its steps several times."""
        copied = object.__new__(type(self))
        _set = object.__setattr__
        _set(copied, "__dict__", {**self.__dict__, **changes})
        _set(copied, "__pydantic_extra__", None)
        _set(copied, "__pydantic_fields_set__", self.__pydantic_fields_set__ | changes.keys())
        _set(copied, "__pydantic_private__", None)
        return copied


class StepChanges(TypedDict, total=False):
    """What a decision may change in a step: ``Step.evolve`` takes only these, typed, so a
    misspelt field or status is a type error, not a silently ignored key."""

    gate_status: GateStatus
    status: StepStatus
    sends: int
    max_sends: int  # grows by one for a send lost with its queue (saga_coordinator.lost)
    attempts: int
    result: dict[str, JsonValue] | None
    error: str | None
    effect_unknown: bool
    started_at: datetime | None
    finished_at: datetime | None
    landed_seq: int | None
    compensation_status: CompensationStatus
    compensation_sends: int
    compensation_max_sends: int
    compensation_attempts: int
    compensation_round: int
    compensation_result: dict[str, JsonValue] | None
    compensation_error: str | None
    compensated_at: datetime | None
    settle_sends: int
    settle_limit: int
    settling: bool
    settle_fence: bool
    key_claims: int
    fence_claims: int
    settled: Settled | None
    settled_by: str | None
    doubt: str | None


class SagaChanges(TypedDict, total=False):
    """What a decision may change in a saga (``SagaState.evolve``, ``with_step``)."""

    status: SagaStatus
    steps: tuple[Step, ...]
    reason: str | None
    needs_human_reason: str | None
    landed_count: int
    updated_at: datetime
    finished_at: datetime | None
    decisions: tuple[Decision, ...]
    waiting_for: str | None
    trace: str | None
    version: int
    awaiting: tuple[Awaiting, ...]
    paused_from: SagaStatus | None


class Step(_Frozen):
    # "class" is the register's word for it; Python reserves the name, hence the alias.
    model_config = ConfigDict(
        frozen=True, extra="forbid", serialize_by_alias=True, validate_by_name=True
    )

    index: int
    action: str
    action_class: ActionClass = Field(alias="class")
    params: dict[str, JsonValue]
    timeout_s: float
    answer_within_s: float = 30.0
    max_sends: int = 3
    result_fields: tuple[str, ...] = ()
    compensation: str | None = None
    compensation_timeout_s: float = 10.0
    compensation_answer_within_s: float = 30.0
    compensation_max_sends: int = 3
    residue: str = ""
    gate: Gate | None = None  # an approval gate stands before this step
    gate_status: GateStatus = "none"

    status: StepStatus = "pending"
    sends: int = 0  # requests sent with this key (resends after a deadline included)
    attempts: int = 0
    result: dict[str, JsonValue] | None = None
    error: str | None = None
    effect_unknown: bool = False
    started_at: datetime | None = None
    finished_at: datetime | None = None
    # Position in the order in which steps landed: compensation runs in reverse of it.
    landed_seq: int | None = None

    compensation_status: CompensationStatus = "none"
    compensation_sends: int = 0
    compensation_attempts: int = 0
    # Bumped by each resume: a stored failure is final for its idempotency key, so a retry that
    # a person asked for needs a fresh key (the compensation itself is idempotent by nature).
    compensation_round: int = 0
    compensation_result: dict[str, JsonValue] | None = None
    compensation_error: str | None = None
    compensated_at: datetime | None = None

    # Settling a forward call whose outcome is unknown (see ``saga_coordinator.doubt``): settle
    # requests sent so far (monotonic across resumes, so each answer is told apart), the last
    # send allowed in this round, whether one is out now, and whether it may fence a claim
    # whose lease expired (a person said it did not happen).
    settle_sends: int = 0
    settle_limit: int = 0
    settling: bool = False
    settle_fence: bool = False
    # How many calls the service last said had claimed the forward key, and how many it had
    # when a person said it did not happen: their word fences the key only while no other call
    # has claimed it since (it covers the calls they knew of, never one made after).
    key_claims: int = 0
    fence_claims: int = 0
    # Once known: which way it went, and who said so (the service, its compensation, a late
    # outcome, a person); ``doubt``: why it was in doubt, or what the service last said.
    settled: Settled | None = None
    settled_by: str | None = None
    doubt: str | None = None

    def evolve(self, **changes: Unpack[StepChanges]) -> Step:
        return self._with(dict(changes))

    @property
    def may_have_landed(self) -> bool:
        if self.settled == "did_not_happen":
            return False
        return self.status in ("done", "compensated", "compensation_failed", "in_doubt") or (
            self.status == "failed" and self.effect_unknown
        )

    @property
    def in_flight(self) -> bool:
        """A request or a settle of this step is out, with its deadline armed."""
        return self.status == "running" or self.compensation_status == "running" or self.settling


class Decision(_Frozen):
    """Who decided what, for the register (aborts, resumes, resolves). ``by`` is the broker
    user that sent the decision, as the broker verified it; ``role`` what that user is."""

    kind: str
    note: str
    at: datetime
    by: str = ""
    role: str = ""
    step: int | None = None  # the gate or the step in doubt it was about


class Awaiting(_Frozen):
    """A command whose answer waits for a step in flight to be settled (an abort that came
    while an irreversible step was out, a person's "it did not happen"): the reply says which
    way it went. ``claimed``: what the sender said ("did_not_happen"), answered as refused
    when the service's record says otherwise."""

    reply_to: str
    command_id: str
    command_type: str
    claimed: Settled | None = None
    message_id: str = ""  # the command's, as the inbox has it


class SagaState(_Frozen):
    saga_id: str
    order_id: str
    saga: str
    status: SagaStatus
    steps: tuple[Step, ...]
    compensation_priority: tuple[str, ...] = ()
    reason: str | None = None  # why it compensates: the failure or the abort
    needs_human_reason: str | None = None  # why it stopped; cleared by resume
    landed_count: int = 0
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None = None
    decisions: tuple[Decision, ...] = ()
    waiting_for: str | None = None  # the saga holding the order, while this one waits
    started_by: Sender | None = None  # who sent the start (an agent may act on its own only)
    # The W3C traceparent of the saga's root span: later messages without a context (deadlines,
    # operators' commands) join the saga's trace by it.
    trace: str | None = None
    # Raised by every stored change: a person's decision names the version it was made on.
    version: int = 0
    awaiting: tuple[Awaiting, ...] = ()
    # In needs_human because a step is in doubt: what the saga was doing before (it goes on
    # that way once the step is settled).
    paused_from: SagaStatus | None = None

    def step(self, index: int) -> Step | None:
        return self.steps[index] if 0 <= index < len(self.steps) else None

    def evolve(self, **changes: Unpack[SagaChanges]) -> SagaState:
        return self._with(dict(changes))

    def with_step(self, step: Step, **changes: Unpack[SagaChanges]) -> SagaState:
        steps = list(self.steps)
        steps[step.index] = step
        return self._with({**changes, "steps": tuple(steps)})

    def register(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def stakes(self) -> dict[str, Any]:
        """What a person deciding at a gate needs: what is left to run, what of it cannot be
        undone, and what compensating now would cost (the residues of what has landed)."""
        to_run = [s for s in self.steps if s.status == "pending"]
        landed = [s for s in self.steps if s.may_have_landed]
        return {
            "still_to_run": [s.action for s in to_run],
            "cannot_be_undone": [
                s.action for s in to_run if s.action_class is ActionClass.IRREVERSIBLE
            ],
            "compensating_now_would": [
                {"undo": s.action, "with": s.compensation, "residue": s.residue or None}
                for s in sorted(landed, key=lambda s: -(s.landed_seq or 0))
                if s.action_class.needs_compensation
            ],
        }


def forward_key(saga_id: str, action: str) -> str:
    return f"{saga_id}:{action}"


def gate_key(saga_id: str, step: Step) -> str:
    return f"{saga_id}:gate:{step.index}"


def compensation_key(saga_id: str, step: Step) -> str:
    assert step.compensation is not None
    base = f"{saga_id}:{step.compensation}"
    return base if step.compensation_round == 0 else f"{base}:resume-{step.compensation_round}"
