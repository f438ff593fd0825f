"""The in-process hand-off (``SAGA_HANDOFF=in-process``) against the real RabbitMQ and Postgres:
requests and outcomes whose consumer runs in the publishing process are handed to it there; what
is not finished there goes the broker's way; a process killed with messages handed over loses
none of its sagas (docs/explanation/design.md, "The in-process hand-off")."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest
from aio_pika.abc import AbstractIncomingMessage
from prometheus_client import REGISTRY

from saga_app.stack import Stack
from saga_coordinator.register import SagaState
from saga_coordinator.store import Store
from saga_shared.config import Settings
from saga_shared.crashpoints import CRASH_EXIT
from saga_shared.errors import RetryLater
from saga_shared.transport.bus import Bus
from saga_shared.transport.handoff import is_local
from tests.integration.helpers import (
    Processes,
    eventually,
    own_database,
    publish_start,
    remove_namespace,
    saga_env,
    terminal,
)
from tests.integration.test_frozen_coordinator import orders_for

ONCE_EACH = {
    "inventory.reserve_stock": 1,
    "erp.create_credit_note": 1,
    "email.send_customer_email": 1,
}


def handed_over(queue: str) -> float:
    return REGISTRY.get_sample_value("saga_handed_over_total", {"queue": queue}) or 0.0


async def effects(pool: asyncpg.Pool, order_id: str) -> dict[str, int]:
    rows = await pool.fetch(
        "SELECT action, count(*) AS n FROM sim_effects WHERE order_id = $1 GROUP BY action",
        order_id,
    )
    return {r["action"]: r["n"] for r in rows}


async def serving(bus: Bus) -> None:
    """Until the process consumes every request and outcome queue (and so takes them in hand)."""
    t = bus.topology
    queues = [t.request_queue(s) for s in t.services]
    queues += [t.outcome_queue(p) for p in range(t.partitions)]
    await eventually(lambda: bus.depths(queues),
                     lambda found: all(d is not None and d.consumers == 1
                                       for d in found.values()))  # fmt: skip


async def final(store: Store, saga_id: str, seconds: float = 60) -> SagaState:
    async def status() -> str | None:
        state = await store.get(saga_id)
        return state.status if state is not None else None

    await eventually(status, lambda s: s in ("completed", "compensated", "needs_human"),
                     seconds=seconds)  # fmt: skip
    state = await store.get(saga_id)
    assert state is not None
    return state


@pytest.fixture
async def here(settings: Settings) -> AsyncIterator[Settings]:
    """This test's settings with the hand-off, on a database of its own: a coordinator takes
    up the running sagas it finds in its database (a start sends their requests again), and
    other tests leave some in the shared one, which would hand over and count more than the
    test's own sagas."""
    async with own_database(settings.database_url, "saga_handoff") as own:
        try:
            yield settings.with_(handoff="in-process", database_url=own)
        finally:
            await remove_namespace(settings)


@pytest.fixture
async def pool(here: Settings) -> AsyncIterator[asyncpg.Pool]:
    """The test's own database (``here``)."""
    opened = await asyncpg.create_pool(here.database_url, min_size=1, max_size=4)
    yield opened
    await opened.close()


@pytest.fixture
async def handing(here: Settings) -> AsyncIterator[Stack]:
    """A whole stack in this process with the hand-off."""
    stack = Stack(here)
    await stack.start()
    try:
        yield stack
    finally:
        await stack.stop()


async def test_a_refund_runs_with_its_requests_and_outcomes_handed_over(
    handing: Stack, order_id: str
) -> None:
    """Every request and outcome of a refund is handed over in the process (the counter an
    operator reads on /metrics), and the saga completes with each effect once."""
    t = handing.bus.topology
    requests = [t.request_queue(s) for s in ("inventory", "erp", "email")]
    outcomes = [t.outcome_queue(p) for p in range(t.partitions)]
    before = sum(map(handed_over, requests + outcomes))
    async with Bus(handing.settings) as bus:
        state = await terminal(handing, await publish_start(bus, order_id))

    assert state.status == "completed"
    assert await effects(handing.pool, order_id) == ONCE_EACH  # the stack's own database
    counts = {q: handed_over(q) for q in requests + outcomes}
    assert sum(counts.values()) - before == 6, counts  # three of each


async def test_an_outcome_not_finished_in_the_process_goes_the_brokers_way(
    handing: Stack, order_id: str
) -> None:
    """The coordinator fails on the first outcome handed to it (the database away, say): the
    outcome is published to its partition's outcome queue, comes back from the broker, and the
    saga completes."""
    seen: list[tuple[str, bool]] = []
    coordinator = handing.coordinator
    assert coordinator is not None
    handle, outcomes = coordinator.handle, handing.bus.topology.outcomes_exchange

    async def fail_first(delivery: AbstractIncomingMessage, partition: int) -> None:
        if delivery.exchange == outcomes:
            seen.append((delivery.message_id or "", is_local(delivery)))
            if len(seen) == 1:
                raise RetryLater("the database is away")
        await handle(delivery, partition)

    coordinator.handle = fail_first  # type: ignore[method-assign]
    async with Bus(handing.settings) as bus:
        state = await terminal(handing, await publish_start(bus, order_id))

    assert state.status == "completed"
    assert seen[0][1] and not seen[1][1]  # handed over, then from the broker
    assert seen[0][0] == seen[1][0]


async def test_outcomes_of_partitions_another_process_holds_go_through_the_broker(
    here: Settings, pool: asyncpg.Pool
) -> None:
    """Two processes with the hand-off, each holding half the partitions and half the services:
    a request for a service of the other, and an outcome for a partition the other holds, go
    through the broker; the rest is handed over. Every saga completes, each effect once."""
    standby = here.with_(standby_after_s=120.0)
    first = Stack(standby.with_(coordinator_share="0/2"), ["coordinator", "inventory"])
    second = Stack(standby.with_(coordinator_share="1/2"),
                   ["coordinator", "erp", "payments", "email"])  # fmt: skip
    orders = orders_for(range(here.partitions))
    await first.start()
    await second.start()
    try:
        async with Bus(here) as bus:
            sagas = [await publish_start(bus, order) for order in orders]
            states = [await terminal(first, saga) for saga in sagas]
    finally:
        await first.stop()
        await second.stop()

    assert [s.status for s in states] == ["completed"] * len(orders)
    assert [await effects(pool, o) for o in orders] == [ONCE_EACH] * len(orders)


async def test_a_process_killed_with_a_request_handed_over_loses_no_saga(
    here: Settings, pool: asyncpg.Pool, tmp_path: Path, order_id: str
) -> None:
    """``saga run all`` with the hand-off dies (as by kill -9) right after the inventory was
    called for a request handed over, before its outcome: the request had left the outbox, and
    nothing of it is in the broker. Started again, the process sends the running request again
    (a start resends what its partitions have out), and the saga completes with one
    reservation. Only a first send is handed over: that send goes through the broker, whose
    redelivery the adapter counts, so a request that kills its process each time reaches the
    delivery limit instead of killing it for ever (a hand-off counts nothing). Here the second
    process dies on it too, and the third counts its return."""
    quick = here.with_(partition_lease_s=3.0)
    procs = Processes(quick, tmp_path)
    queue = Bus(here).topology.request_queue("inventory")
    try:
        async with Bus(here) as bus:
            await bus.declare()
            first = await procs.start("all", crash_at="adapter.before_publish")
            await serving(bus)
            saga = await publish_start(bus, order_id)
            assert await asyncio.wait_for(first.wait(), 60) == CRASH_EXIT
            assert await effects(pool, order_id) == {"inventory.reserve_stock": 1}
            second = await procs.start("all", crash_at="adapter.before_publish")
            assert await asyncio.wait_for(second.wait(), 60) == CRASH_EXIT
            await procs.start("all")
            state = await final(Store(pool), saga)
    finally:
        await procs.stop_all()

    assert state.status == "completed"
    assert await effects(pool, order_id) == ONCE_EACH
    counted = await pool.fetch("SELECT deliveries FROM delivery_counts WHERE queue = $1", queue)
    assert [r["deliveries"] for r in counted] == [2]


def test_the_handoff_is_refused_in_roles_identity(settings: Settings, tmp_path: Path) -> None:
    """In roles identity every message's sender is checked by the broker, which a hand-off
    would skip: `saga run` refuses at once, in one line naming both variables."""
    env = saga_env(settings) | {"SAGA_IDENTITY": "roles", "SAGA_HANDOFF": "in-process",
                                "SAGA_SECRETS_DIR": str(tmp_path)}  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "saga_app.cli", "run", "all"], env=env, capture_output=True,
        text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "SAGA_HANDOFF=in-process needs SAGA_IDENTITY=shared" in lines[0]


async def test_a_process_stopped_under_load_with_the_hand_off_leaves_every_saga_to_the_next(
    here: Settings, pool: asyncpg.Pool, tmp_path: Path
) -> None:
    """``saga run all`` with the hand-off is stopped (SIGTERM) while sagas are under way: it
    finishes what it has in hand, sends what it had handed over and not started the broker's way
    (``tests/unit/test_handoff.py`` shows how), and a process started after it finishes every
    saga, each effect once."""
    quick = here.with_(partition_lease_s=3.0)
    procs = Processes(quick, tmp_path)
    orders = [f"order-{os.urandom(5).hex()}" for _ in range(40)]
    try:
        first = await procs.start("all")
        async with Bus(here) as bus:
            await bus.declare()
            await serving(bus)
            sagas = [await publish_start(bus, order) for order in orders]
            store = Store(pool)
            await eventually(lambda: store.get(sagas[0]), lambda s: s is not None)
            first.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(first.wait(), 60) == 0
            await procs.start("all")
            states = [await final(store, saga) for saga in sagas]
    finally:
        await procs.stop_all()

    assert [s.status for s in states] == ["completed"] * len(orders)
    assert [await effects(pool, o) for o in orders] == [ONCE_EACH] * len(orders)
