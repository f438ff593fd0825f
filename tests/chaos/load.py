"""The chaos load: which sagas run on which orders, which faults are injected, what to expect.

Faults are chosen so that their effect is certain whatever the chaos does to the processes:

* ``permanent``: the system refuses every call; the step fails and nothing landed.
* ``transient:K`` with K below the retry attempts: the first K calls fail, then it works. However
  the calls are spread over redeliveries and resends (an adapter killed mid-retry, a deadline),
  fewer than ``attempts`` failures can never exhaust one delivery's retries: the step succeeds.
* ``transient:1000``: more failures than any run makes calls; every delivery exhausts its retries,
  so the step fails with an unknown effect and must be compensated anyway; unless the adapter was
  killed mid-call and, its attempts spent, a settle fenced the key and found nothing landed: then
  the step certainly failed and needs no way back (``Expectation.if_not_landed``).

A count between the two (K >= attempts, but small) would pass or fail depending on how the
chaos spread the calls, so it is never drawn: each saga's outcome is known in advance.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import asyncpg
from pydantic import JsonValue

from saga_services.faults import MAX_TRANSIENT, add_fault
from saga_shared.config import Settings
from saga_shared.model.catalog import ActionClass, Catalog
from saga_shared.model.messages import AbortSaga, ResumeSaga, StartSaga
from saga_shared.transport.bus import Bus

VALIDATE_ADDRESS = "erp.validate_address"
CLOSED_ADDRESS = "Closed depot, 7 Harbour Quay"
OPEN_ADDRESS = "12 Market Street"
Outcome = Literal["completed", "compensated", "needs_human"]


# --- the plans, read from the catalog ------------------------------------------------------------


@dataclass(frozen=True)
class PlanStep:
    index: int
    action: str
    action_class: ActionClass
    compensation: str | None
    attempts: int  # the adapter's bounded retries of transient errors
    compensation_attempts: int

    @property
    def compensable(self) -> bool:
        return self.action_class.needs_compensation


def saga_plans(
    catalog: Catalog, kinds: tuple[str, ...] = ("refund", "checkout")
) -> dict[str, tuple[PlanStep, ...]]:
    plans = {}
    for kind in kinds:
        steps = []
        for index, action in enumerate(catalog.sagas[kind].steps):
            spec = catalog.actions[action]
            comp = spec.compensation
            steps.append(
                PlanStep(
                    index=index,
                    action=action,
                    action_class=spec.action_class,
                    compensation=comp,
                    attempts=catalog.retry_policy(action).attempts,
                    compensation_attempts=catalog.retry_policy(comp).attempts if comp else 0,
                )
            )
        plans[kind] = tuple(steps)
    return plans


# --- the load ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fault:
    action: str
    order_id: str
    mode: str
    fails: bool  # certainly fails for ever (permanent, or more transient errors than any run)
    effect_unknown: bool  # how the failure is reported: retries exhausted -> may have landed


@dataclass(frozen=True)
class PlannedSaga:
    saga_id: str
    order_id: str
    kind: str
    params: dict[str, JsonValue]
    message_id: str  # fixed up front: a re-sent start must be the same message
    # The agent aborts the saga this long after its start is confirmed (None: never).
    abort_after_s: float | None = None

    @property
    def closed_address(self) -> bool:
        return "closed" in str(self.params.get("address", "")).casefold()

    def abort(self) -> AbortSaga:
        return AbortSaga(
            message_id=f"abort-{self.message_id}",
            saga_id=self.saga_id,
            order_id=self.order_id,
            reason="chaos: the agent changed its mind",
        )

    def command(self) -> StartSaga:
        return StartSaga(
            message_id=self.message_id,
            saga_id=self.saga_id,
            order_id=self.order_id,
            saga=self.kind,
            params=self.params,
        )


@dataclass
class Load:
    plans: dict[str, tuple[PlanStep, ...]]
    sagas: list[PlannedSaga] = field(default_factory=list)
    # Per order, in the order its agent publishes them (each after the previous is confirmed).
    orders: dict[str, list[PlannedSaga]] = field(default_factory=dict)
    faults: dict[tuple[str, str], Fault] = field(default_factory=dict)
    # Sagas an operator resumed from needs_human once their order's faults were cleared.
    resumed: set[str] = field(default_factory=set)

    def faults_of(self, order_id: str) -> dict[str, Fault]:
        return {a: f for (o, a), f in self.faults.items() if o == order_id}

    def describe(self) -> dict[str, Any]:
        """Everything injected, for the run directory: ``from_description`` rebuilds the load
        from it, to check a kept database again (``python -m tests.chaos --reverify DIR``)."""
        return {
            "sagas": [
                {
                    "saga_id": s.saga_id,
                    "order_id": s.order_id,
                    "kind": s.kind,
                    "params": s.params,
                    "message_id": s.message_id,
                    "abort_after_s": s.abort_after_s,
                }
                for s in self.sagas
            ],
            "resumed": sorted(self.resumed),
            "faults": [
                {
                    "order_id": f.order_id,
                    "action": f.action,
                    "mode": f.mode,
                    "fails": f.fails,
                    "effect_unknown": f.effect_unknown,
                }
                for f in self.faults.values()
            ],
        }

    @classmethod
    def from_description(
        cls, plans: dict[str, tuple[PlanStep, ...]], described: dict[str, Any]
    ) -> Load:
        load = cls(plans)
        for raw in described["sagas"]:
            saga = PlannedSaga(
                saga_id=raw["saga_id"],
                order_id=raw["order_id"],
                kind=raw["kind"],
                params=raw["params"],
                message_id=raw.get("message_id", ""),
                abort_after_s=raw.get("abort_after_s"),
            )
            load.sagas.append(saga)
            load.orders.setdefault(saga.order_id, []).append(saga)
        for raw in described["faults"]:
            unknown = raw.get("effect_unknown", raw["mode"] == f"transient:{MAX_TRANSIENT}")
            fault = Fault(raw["action"], raw["order_id"], raw["mode"], raw["fails"], unknown)
            load.faults[(fault.order_id, fault.action)] = fault
        load.resumed = set(described.get("resumed", []))
        return load


@dataclass(frozen=True)
class LoadShape:
    sagas: int
    forward_fault_share: float = 0.3  # orders with a fault on a forward action
    compensation_fault_share: float = 0.3  # orders with a fault on a compensation
    closed_address_share: float = 0.1  # checkouts to a closed depot (validate_address refuses)
    # Sagas per order, drawn uniformly from this list: some orders run 2-3 sagas in a row.
    per_order: tuple[int, ...] = (1, 1, 1, 1, 1, 1, 2, 2, 2, 3)
    with_faults: bool = True  # False: no fault and no closed depot, every saga must complete
    abort_share: float = 0.05  # sagas the agent aborts soon after starting them


def plan_load(shape: LoadShape, plans: dict[str, tuple[PlanStep, ...]], rng: random.Random) -> Load:
    load = Load(plans)
    run = f"{rng.getrandbits(24):06x}"
    order_no = 0
    while len(load.sagas) < shape.sagas:
        order_no += 1
        order_id = f"ord-{run}-{order_no:05d}"
        count = min(rng.choice(shape.per_order), shape.sagas - len(load.sagas))
        sagas = [_saga(order_id, n, shape, rng) for n in range(count)]
        load.orders[order_id] = sagas
        load.sagas.extend(sagas)
        if shape.with_faults:
            for fault in _faults_for(order_id, sagas, shape, plans, rng):
                load.faults[(fault.order_id, fault.action)] = fault
    return load


def _saga(order_id: str, n: int, shape: LoadShape, rng: random.Random) -> PlannedSaga:
    kind = rng.choice(("refund", "checkout"))
    params: dict[str, JsonValue] = {
        "sku": f"SKU-{rng.randint(1, 50)}",
        "quantity": rng.randint(1, 3),
        "amount_cents": rng.randint(100, 99_999),
        "customer_email": f"customer{rng.randint(1, 10_000)}@example.com",
    }
    if kind == "checkout":
        closed = shape.with_faults and rng.random() < shape.closed_address_share
        params["card_token"] = "tok_visa_4242"
        params["address"] = CLOSED_ADDRESS if closed else OPEN_ADDRESS
    aborted = shape.with_faults and rng.random() < shape.abort_share
    return PlannedSaga(
        saga_id=f"{order_id}-s{n + 1}-{rng.getrandbits(32):08x}",
        order_id=order_id,
        kind=kind,
        params=params,
        message_id=f"start-{order_id}-{n + 1}-{rng.getrandbits(32):08x}",
        abort_after_s=round(rng.uniform(0.0, 1.5), 2) if aborted else None,
    )


def _faults_for(
    order_id: str,
    sagas: list[PlannedSaga],
    shape: LoadShape,
    plans: dict[str, tuple[PlanStep, ...]],
    rng: random.Random,
) -> Iterator[Fault]:
    steps = {s.action: s for saga in sagas for s in plans[saga.kind]}
    if rng.random() < shape.forward_fault_share:
        step = steps[rng.choice(sorted(steps))]
        yield _draw_fault(order_id, step.action, step.attempts, rng)
    # On an order of several sagas, one that ends in needs_human holds the order until a person
    # acts (rule 6): the sagas behind it must wait, never start, which the checks verify.
    compensations = sorted({s.compensation: s for s in steps.values() if s.compensation}.items())
    if compensations and rng.random() < shape.compensation_fault_share:
        action, step = rng.choice(compensations)
        yield _draw_fault(order_id, action, step.compensation_attempts, rng)


def _draw_fault(order_id: str, action: str, attempts: int, rng: random.Random) -> Fault:
    roll = rng.random()
    if roll < 0.35:
        return Fault(action, order_id, "permanent", fails=True, effect_unknown=False)
    if roll < 0.7 and attempts > 1:
        k = rng.randint(1, attempts - 1)
        return Fault(action, order_id, f"transient:{k}", fails=False, effect_unknown=False)
    return Fault(action, order_id, f"transient:{MAX_TRANSIENT}", fails=True, effect_unknown=True)


async def inject_faults(pool: asyncpg.Pool, load: Load) -> None:
    for fault in load.faults.values():
        await add_fault(pool, fault.action, fault.order_id, fault.mode)


# --- what each saga must end as ----------------------------------------------------------------


@dataclass(frozen=True)
class Expectation:
    outcome: Outcome
    failing_step: int | None = None  # the forward step that certainly fails
    effect_unknown: bool = False  # ...and whether it fails as "may have landed"
    failing_compensation: int | None = None  # the step whose compensation fails (needs_human)
    why: str = ""
    # Other outcomes a race makes possible (an abort that may come before or after the end).
    also: frozenset[str] = frozenset()
    # For a failure of unknown effect: the outcome when the adapter found out nothing landed (a
    # claim killed mid-call, then fenced by a settle), so the failing step needs no way back.
    if_not_landed: Outcome | None = None

    def allows(self, status: str) -> bool:
        return status == self.outcome or status in self.also


def expect(saga: PlannedSaga, load: Load) -> Expectation:
    """What the saga must end as: from its faults; for a resumed saga, compensated (its
    order's faults were cleared first, so the rest of the way back works, and so does every
    saga of the order that ran after it); for an aborted one, also compensated, or needs_human
    when a compensation of its order fails, as the abort arrived before or after the end."""
    order = load.orders.get(saga.order_id, [saga])
    resumed = [i for i, s in enumerate(order) if s.saga_id in load.resumed]
    if saga.saga_id in load.resumed:
        return Expectation("compensated", why="resumed after its faults were cleared")
    cleared = bool(resumed) and order.index(saga) > resumed[0]
    want = _expected_from_faults(saga, load, {} if cleared else load.faults_of(saga.order_id))
    if saga.abort_after_s is None:
        return want
    also = {"compensated"}
    if any(f.fails for a, f in load.faults_of(saga.order_id).items() if _is_compensation(load, a)):
        also.add("needs_human")
    return replace(want, also=frozenset(also - {want.outcome}), why=f"{want.why}; aborted")


def _is_compensation(load: Load, action: str) -> bool:
    return any(step.compensation == action for plan in load.plans.values() for step in plan)


def _expected_from_faults(saga: PlannedSaga, load: Load, faults: dict[str, Fault]) -> Expectation:
    plan = load.plans[saga.kind]
    failing = _first_certain_failure(saga, plan, faults)
    if failing is None:
        return Expectation("completed", why="no certain failure injected")
    step, unknown, why = failing
    want = _way_back(plan, faults, step, unknown, why)
    if unknown:
        known = _way_back(plan, faults, step, False, why)
        return replace(want, if_not_landed=known.outcome)
    return want


def _way_back(
    plan: tuple[PlanStep, ...], faults: dict[str, Fault], step: int, unknown: bool, why: str
) -> Expectation:
    landed = [s for s in plan[:step] if s.compensable]
    if unknown and plan[step].compensable:
        landed.append(plan[step])
    # Compensation runs in reverse order of landing and stops at the first that fails.
    for undo in reversed(landed):
        fault = faults.get(undo.compensation or "")
        if fault is not None and fault.fails:
            why += f"; compensation {fault.action} of step {undo.index} has fault {fault.mode}"
            return Expectation("needs_human", step, unknown, undo.index, why)
    return Expectation("compensated", step, unknown, why=why)


def _first_certain_failure(
    saga: PlannedSaga, plan: tuple[PlanStep, ...], faults: dict[str, Fault]
) -> tuple[int, bool, str] | None:
    for step in plan:
        fault = faults.get(step.action)
        if fault is not None and fault.fails:
            return step.index, fault.effect_unknown, f"{step.action} has fault {fault.mode}"
        if step.action == VALIDATE_ADDRESS and saga.closed_address:
            return step.index, False, f"{step.action}: the address is a closed depot"
    return None


# --- publishing, as an agent would ---------------------------------------------------------------


@dataclass
class PublishStats:
    confirmed: int = 0
    retries: int = 0  # publishes that raised (broker down, no confirm) and were sent again
    reconnects: int = 0  # times the agent gave up on its connection and opened a new one
    errors: dict[str, int] = field(default_factory=dict)  # kinds of error seen, with counts
    confirmed_ids: set[str] = field(default_factory=set)
    aborts: int = 0  # abort commands confirmed
    resumes: int = 0  # resume commands confirmed, after the load


class Publisher:
    """Publishes every start command to the commands exchange with publisher confirms.

    Each order's agent publishes its sagas one after the other, each once the previous one is
    confirmed, so the order's arrival order is its publish order. A start that is not confirmed
    (the broker is down, the confirm never came) is sent again, the SAME message (same saga id,
    same message id), until it is confirmed: a copy that did arrive is absorbed downstream."""

    # An agent that sees every publish fail for this long opens a new connection (the robust
    # connection should recover by itself; this is the agent's own safety net, and counted).
    STUCK_S = 30.0

    def __init__(
        self, settings: Settings, load: Load, rate: float, say: Callable[[str], None]
    ) -> None:
        self.settings = settings
        self.load = load
        self.rate = rate
        self.say = say
        self.stats = PublishStats()
        self._bus: Bus | None = None
        self._failing_since: float | None = None
        self._reconnecting = asyncio.Lock()

    async def run(self) -> None:
        self._bus = Bus(self.settings)
        await self._bus.connect()
        try:
            await self._publish_all()
        finally:
            await self._bus.close()
            self._bus = None

    async def _publish_all(self) -> None:
        start = time.monotonic()
        tasks = []
        slot = 0
        for sagas in self.load.orders.values():
            # Pace the load: order k's first saga goes out at its slot, so the chaos runs
            # while sagas are still arriving, not only while a backlog drains.
            delay = start + slot / self.rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(self._agent(sagas)))
            slot += len(sagas)
        await asyncio.gather(*tasks)

    async def _agent(self, sagas: list[PlannedSaga]) -> None:
        for saga in sagas:
            await self._publish_until_confirmed(saga.command())
            self.stats.confirmed_ids.add(saga.saga_id)
            if saga.abort_after_s is not None:
                await asyncio.sleep(saga.abort_after_s)
                await self._publish_until_confirmed(saga.abort(), start=False)
                self.stats.aborts += 1

    async def publish_command(self, command: StartSaga | AbortSaga | ResumeSaga) -> None:
        """One command, re-sent (the same message) until the broker confirms it."""
        if self._bus is None:
            self._bus = Bus(self.settings)
            await self._bus.connect()
        await self._publish_until_confirmed(command, start=False)

    async def _publish_until_confirmed(
        self, command: StartSaga | AbortSaga | ResumeSaga, *, start: bool = True
    ) -> None:
        backoff = 0.2
        while True:
            bus = self._bus
            assert bus is not None
            try:
                key = bus.topology.command_key(command.type, command.order_id)
                await bus.publish(bus.topology.commands_exchange, key, command)
            except Exception as exc:
                self._failed(exc)
                await self._maybe_reconnect(bus)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            self._confirmed(start)
            return

    def _failed(self, exc: Exception) -> None:
        self.stats.retries += 1
        kind = type(exc).__name__
        self.stats.errors[kind] = self.stats.errors.get(kind, 0) + 1
        if self._failing_since is None:
            self._failing_since = time.monotonic()

    def _confirmed(self, start: bool) -> None:
        self._failing_since = None
        self.stats.confirmed += 1 if start else 0  # starts: what a run must get through

    async def _maybe_reconnect(self, bus: Bus) -> None:
        since = self._failing_since
        if since is None or time.monotonic() - since < self.STUCK_S:
            return
        async with self._reconnecting:
            if self._bus is not bus or self._failing_since != since:
                return  # another agent already tried
            # One attempt per STUCK_S, whatever its outcome: hundreds of agents fail together.
            self._failing_since = time.monotonic()
            self.say(f"agent: no confirm for {self.STUCK_S:g}s; opening a new connection")
            self.stats.reconnects += 1
            fresh = Bus(self.settings)
            try:
                await fresh.connect()
            except Exception as exc:
                self._failed(exc)
                return
            self._bus = fresh
            try:
                await bus.close()
            except Exception as exc:
                self._failed(exc)
