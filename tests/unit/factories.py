"""Builders for the pure unit tests: catalogs, commands, outcomes, and a driver that feeds a saga
through ``machine.decide`` the way the coordinator would, one message at a time."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from pydantic import JsonValue

from saga_coordinator.machine import decide
from saga_coordinator.register import SagaState, Step
from saga_coordinator.transition import Event, Reply, Transition
from saga_shared.model.catalog import Catalog
from saga_shared.model.gateway import load_catalog
from saga_shared.model.messages import (
    AbortSaga,
    ActionDone,
    ActionFailed,
    ActionRequest,
    ActionSettled,
    CommandReply,
    PartitionMessage,
    Plan,
    PlanStep,
    ResolveSaga,
    ResumeSaga,
    Role,
    SagaEvent,
    Sender,
    SettleRequest,
    SettleSaga,
    SettleVerdict,
    StartSaga,
)

REPO = Path(__file__).resolve().parents[2]
CATALOG_FILE = REPO / "shared" / "catalog.toml"
T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)

REFUND_PARAMS: dict[str, JsonValue] = {
    "sku": "SKU-1",
    "quantity": 2,
    "amount_cents": 1500,
    "customer_email": "ada@example.com",
}
CHECKOUT_PARAMS: dict[str, JsonValue] = {
    "sku": "SKU-1",
    "quantity": 2,
    "amount_cents": 4200,
    "card_token": "tok_visa",
    "address": "1 Main St",
    "customer_email": "ada@example.com",
}


def real_catalog() -> Catalog:
    return load_catalog(CATALOG_FILE)


# --- ad-hoc catalogs -----------------------------------------------------------------------------


def compensable(compensation: str, result: Sequence[str] = ("id",), **extra: Any) -> dict[str, Any]:
    return {"class": "compensable", "compensation": compensation, "result": list(result), **extra}


def with_residue(
    compensation: str, residue: str = "both lines stay on the statement", **extra: Any
) -> dict[str, Any]:
    return {
        "class": "compensable_with_residue",
        "compensation": compensation,
        "residue": residue,
        "result": ["id"],
        **extra,
    }


def read_only(**extra: Any) -> dict[str, Any]:
    return {"class": "read_only", **extra}


def irreversible(**extra: Any) -> dict[str, Any]:
    return {"class": "irreversible", "result": ["id"], **extra}


def make_catalog(
    actions: Mapping[str, Mapping[str, Any]],
    compensations: Sequence[str] | Mapping[str, Mapping[str, Any]] = (),
    sagas: Mapping[str, Mapping[str, Any]] | None = None,
) -> Catalog:
    """A catalog built in memory. Model validation only: the gateway rules are NOT checked here,
    so a test can build a catalog that breaks them and watch the gateway refuse it."""
    comps = (
        {name: dict(spec) for name, spec in compensations.items()}
        if isinstance(compensations, Mapping)
        else {name: {} for name in compensations}
    )
    return Catalog.model_validate(
        {
            "actions": {name: dict(spec) for name, spec in actions.items()},
            "compensations": comps,
            "sagas": {name: dict(spec) for name, spec in (sagas or {}).items()},
        }
    )


# --- messages ------------------------------------------------------------------------------------


# Commands as the intake forwards them: with the broker-verified sender. Sagas are started by an
# agent; decisions are a person's unless a test says otherwise.
AGENT = Sender(user="agent-7", role="agent")


def sender(user: str = "", role: Role = "person") -> Sender:
    return Sender(user=user or ("agent-7" if role == "agent" else "ann"), role=role)


def start_named(
    saga: str,
    params: Mapping[str, JsonValue],
    *,
    saga_id: str = "saga-1",
    order_id: str = "order-1",
    reply_to: str | None = None,
) -> StartSaga:
    return StartSaga(
        saga_id=saga_id,
        order_id=order_id,
        saga=saga,
        params=dict(params),
        reply_to=reply_to,
        sender=AGENT,
    )


def start_plan(
    steps: Sequence[str],
    params: Mapping[str, JsonValue] | None = None,
    *,
    priority: Sequence[str] = (),
    saga_id: str = "saga-1",
    order_id: str = "order-1",
    reply_to: str | None = None,
) -> StartSaga:
    plan = Plan(
        steps=tuple(PlanStep(action=a) for a in steps), compensation_priority=tuple(priority)
    )
    return StartSaga(
        saga_id=saga_id,
        order_id=order_id,
        plan=plan,
        params=dict(params or {}),
        reply_to=reply_to,
        sender=AGENT,
    )


def done_for(
    request: ActionRequest, result: Mapping[str, JsonValue], *, tries: int = 1
) -> ActionDone:
    return ActionDone(
        saga_id=request.saga_id,
        order_id=request.order_id,
        action=request.action,
        phase=request.phase,
        step=request.step,
        idempotency_key=request.idempotency_key,
        attempt=request.attempt,
        tries=tries,
        result=dict(result),
    )


def failed_for(
    request: ActionRequest, reason: str, *, effect_unknown: bool, tries: int = 1
) -> ActionFailed:
    return ActionFailed(
        saga_id=request.saga_id,
        order_id=request.order_id,
        action=request.action,
        phase=request.phase,
        step=request.step,
        idempotency_key=request.idempotency_key,
        attempt=request.attempt,
        tries=tries,
        reason=reason,
        effect_unknown=effect_unknown,
    )


def settled_for(
    request: SettleRequest,
    verdict: SettleVerdict,
    *,
    result: Mapping[str, JsonValue] | None = None,
    reason: str = "",
    effect_unknown: bool = False,
    claims: int | None = None,
) -> ActionSettled:
    return ActionSettled(
        saga_id=request.saga_id,
        order_id=request.order_id,
        action=request.action,
        step=request.step,
        idempotency_key=request.idempotency_key,
        attempt=request.attempt,
        verdict=verdict,
        result=None if result is None else dict(result),
        reason=reason,
        effect_unknown=effect_unknown,
        claims=claims,
    )


# --- reading a transition ------------------------------------------------------------------------


def requests_of(t: Transition) -> list[ActionRequest]:
    return [m for m in t.out if isinstance(m, ActionRequest)]


def settles_of(t: Transition) -> list[SettleRequest]:
    return [m for m in t.out if isinstance(m, SettleRequest)]


def events_of(t: Transition) -> list[SagaEvent]:
    """The transition's lifecycle events as their messages."""
    return [m.message() for m in t.out if isinstance(m, Event)]


def event_types(t: Transition) -> list[str]:
    return [e.type for e in events_of(t)]


def replies_of(t: Transition) -> list[Reply]:
    return [m for m in t.out if isinstance(m, Reply)]


def only_reply(t: Transition) -> CommandReply:
    replies = replies_of(t)
    assert len(replies) == 1, t.out
    return replies[0].message


def event(t: Transition, kind: str) -> SagaEvent:
    found = [e for e in events_of(t) if e.type == kind]
    assert len(found) == 1, f"expected one {kind} event, got {event_types(t)}"
    return found[0]


def default_result(step: Step) -> dict[str, JsonValue]:
    """What a well-behaved adapter returns: every field the compensation needs."""
    return {field: f"{field}-{step.index}" for field in step.result_fields}


# --- the driver ----------------------------------------------------------------------------------


class Driver:
    """Feeds messages to ``decide`` and keeps what the store would keep: the state. Answers the
    request in flight the way an adapter would."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.state: SagaState | None = None
        self.transitions: list[Transition] = []
        self.requests: list[ActionRequest] = []
        self.settles: list[SettleRequest] = []
        self._tick = 0

    # time moves one second per message, so timestamps tell messages apart
    def now(self) -> datetime:
        self._tick += 1
        return T0 + timedelta(seconds=self._tick)

    def feed(self, message: PartitionMessage) -> Transition:
        t = decide(self.state, message, self.catalog, self.now())
        self.state = t.state
        self.transitions.append(t)
        self.requests.extend(requests_of(t))
        self.settles.extend(settles_of(t))
        return t

    @property
    def st(self) -> SagaState:
        assert self.state is not None
        return self.state

    def status(self) -> str:
        """The saga's status now (a method, so that a type checker never narrows it)."""
        return self.st.status

    @property
    def saga_id(self) -> str:
        return self.st.saga_id

    @property
    def last_request(self) -> ActionRequest:
        assert self.requests, "no action was ever requested"
        return self.requests[-1]

    def in_flight(self) -> ActionRequest | SettleRequest | None:
        """What still waits for an answer, read from the register: the settle of a step in
        doubt when one is out (an abort settles an irreversible step first), else the request."""
        if self.state is None:
            return None
        busy = [s for s in self.state.steps if s.in_flight]
        if not busy:
            return None
        assert len(busy) == 1
        if busy[0].settling:
            return self.last_settle
        return self.last_request

    @property
    def last_settle(self) -> SettleRequest:
        assert self.settles, "no settle was ever sent"
        return self.settles[-1]

    def settled(
        self,
        verdict: SettleVerdict,
        *,
        result: Mapping[str, JsonValue] | None = None,
        reason: str = "",
        effect_unknown: bool = False,
        request: SettleRequest | None = None,
        claims: int | None = None,
    ) -> Transition:
        """The service's answer to the last settle (or to ``request``)."""
        req = request or self.last_settle
        answer = settled_for(req, verdict, result=result, reason=reason,
                             effect_unknown=effect_unknown, claims=claims)  # fmt: skip
        return self.feed(answer)

    def settle(
        self,
        step: int,
        *,
        happened: bool,
        note: str = "checked the mail server's log",
        by: str = "ana",
        role: Role = "person",
        version: int | None = None,
        reply_to: str | None = None,
    ) -> Transition:
        """A person's decision on a step in doubt."""
        return self.feed(
            SettleSaga(
                saga_id=self.saga_id, order_id=self.st.order_id, step=step, happened=happened,
                note=note, version=version, sender=sender(by, role), reply_to=reply_to,
            )
        )  # fmt: skip

    def step(self, index: int) -> Step:
        step = self.st.step(index)
        assert step is not None
        return step

    # answers --------------------------------------------------------------------------------

    def done(
        self,
        result: Mapping[str, JsonValue] | None = None,
        *,
        tries: int = 1,
        request: ActionRequest | None = None,
    ) -> Transition:
        req = request or self.last_request
        if result is None:
            result = (
                default_result(self.step(req.step))
                if req.phase == "forward"
                else {"undone": f"{req.action}-{req.step}"}
            )
        return self.feed(done_for(req, result, tries=tries))

    def fail(
        self,
        reason: str = "card declined",
        *,
        effect_unknown: bool = False,
        tries: int = 1,
        request: ActionRequest | None = None,
    ) -> Transition:
        req = request or self.last_request
        return self.feed(failed_for(req, reason, effect_unknown=effect_unknown, tries=tries))

    def abort(
        self,
        reason: str = "the customer cancelled",
        by: str = "",
        reply_to: str | None = None,
        role: Role = "person",
    ) -> Transition:
        return self.feed(
            AbortSaga(
                saga_id=self.saga_id,
                order_id=self.st.order_id,
                reason=reason,
                sender=sender(by, role),
                reply_to=reply_to,
            )
        )

    def resume(
        self,
        note: str = "fixed by hand",
        by: str = "",
        reply_to: str | None = None,
        role: Role = "person",
    ) -> Transition:
        return self.feed(
            ResumeSaga(
                saga_id=self.saga_id,
                order_id=self.st.order_id,
                note=note,
                sender=sender(by, role),
                reply_to=reply_to,
            )
        )

    def resolve(
        self,
        note: str = "undone by hand",
        by: str = "",
        reply_to: str | None = None,
        role: Role = "person",
    ) -> Transition:
        return self.feed(
            ResolveSaga(
                saga_id=self.saga_id,
                order_id=self.st.order_id,
                note=note,
                sender=sender(by, role),
                reply_to=reply_to,
            )
        )

    # summaries ------------------------------------------------------------------------------

    def forward_requests(self) -> list[tuple[int, str]]:
        return [(r.step, r.action) for r in self.requests if r.phase == "forward"]

    def compensation_requests(self) -> list[tuple[int, str]]:
        return [(r.step, r.action) for r in self.requests if r.phase == "compensation"]

    def run_forward(self, n: int) -> None:
        """Answer ``done`` to the next ``n`` forward requests."""
        for _ in range(n):
            assert self.last_request.phase == "forward"
            self.done()


def assert_ignored(d: Driver, t: Transition, before: SagaState | None) -> None:
    assert t.changed is False
    assert t.out == ()
    assert d.state == before
