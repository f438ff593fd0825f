"""A process killed at the worst instants loses nothing and applies nothing twice.

The components run as real processes; ``SAGA_CRASH_POINT`` makes one die exactly where a
``kill -9`` would hurt most, then it is started again without it.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from saga_app.stack import Stack
from saga_shared.config import Settings
from saga_shared.crashpoints import CRASH_EXIT
from saga_shared.transport.bus import Bus
from tests.integration.helpers import (
    Processes,
    consumers_of,
    eventually,
    publish_start,
    remove_namespace,
    terminal,
)


@pytest.fixture
async def procs(settings: Settings, tmp_path: Path) -> AsyncIterator[Processes]:
    running = Processes(settings, tmp_path)
    try:
        yield running
    finally:
        await running.stop_all()
        await remove_namespace(settings)


async def crashed(proc: asyncio.subprocess.Process) -> None:
    code = await asyncio.wait_for(proc.wait(), 30)
    assert code == CRASH_EXIT, f"expected the rehearsed crash, got exit {code}"


async def effects(pool: asyncpg.Pool, order_id: str) -> dict[str, int]:
    rows = await pool.fetch(
        "SELECT action, count(*) AS n FROM sim_effects WHERE order_id = $1 GROUP BY action",
        order_id,
    )
    return {r["action"]: r["n"] for r in rows}


ONCE_EACH = {
    "inventory.reserve_stock": 1,
    "erp.create_credit_note": 1,
    "email.send_customer_email": 1,
}


async def test_coordinator_killed_between_commit_and_publish(
    settings: Settings, procs: Processes, pool: asyncpg.Pool, order_id: str
) -> None:
    async with (
        Stack(settings, ["inventory", "erp", "payments", "email"]) as adapters,
        Bus(settings) as bus,
    ):
        first = await procs.start("coordinator", crash_at="coordinator.before_publish")
        saga_id = await publish_start(bus, order_id)
        await crashed(first)
        pending = await pool.fetchval("SELECT count(*) FROM outbox WHERE order_id = $1", order_id)
        assert pending >= 1  # committed, never published: the next relay publishes it

        await procs.start("coordinator")
        state = await terminal(adapters, saga_id)

    assert state.status == "completed"
    assert await effects(pool, order_id) == ONCE_EACH


async def test_a_relay_killed_between_its_read_and_its_publish_loses_nothing(
    settings: Settings, procs: Processes, pool: asyncpg.Pool, order_id: str
) -> None:
    """The relay publishes what the committing task does not: here a deadline's message."""
    async with Stack(settings, ["inventory", "erp", "payments", "email"]) as adapters:
        await pool.execute(
            "INSERT INTO outbox (exchange, routing_key, message_id, message_type, order_id, body)"
            " VALUES ($1, '', 'm-relay', 'saga.event', $2, '{}'::bytea)",
            f"{settings.namespace}.events", order_id,
        )  # fmt: skip
        first = await procs.start("coordinator", crash_at="relay.before_publish")
        await crashed(first)
        assert await pool.fetchval("SELECT count(*) FROM outbox WHERE message_id = 'm-relay'")
        await procs.start("coordinator")
        await eventually(
            lambda: pool.fetchval("SELECT count(*) FROM outbox WHERE message_id = 'm-relay'"),
            lambda n: n == 0,
        )
        assert adapters.coordinator is None


async def test_coordinator_killed_between_publish_and_ack(
    settings: Settings, procs: Processes, pool: asyncpg.Pool, order_id: str
) -> None:
    async with (
        Stack(settings, ["inventory", "erp", "payments", "email"]) as adapters,
        Bus(settings) as bus,
    ):
        first = await procs.start("coordinator", crash_at="coordinator.before_ack")
        saga_id = await publish_start(bus, order_id)
        await crashed(first)
        assert await adapters.store.get(saga_id) is not None  # committed before the crash

        await procs.start("coordinator")
        state = await terminal(adapters, saga_id)
        log = await eventually(
            lambda: adapters.store.history(saga_id),
            lambda rows: any(r["note"] == "duplicate absorbed" for r in rows),
        )

    assert state.status == "completed"
    assert [r["message_type"] for r in log].count("saga.start") >= 2  # redelivered, absorbed
    assert await effects(pool, order_id) == ONCE_EACH


async def test_adapter_killed_after_calling_its_system_before_publishing(
    settings: Settings, procs: Processes, pool: asyncpg.Pool, order_id: str
) -> None:
    async with (
        Stack(settings, ["coordinator", "erp", "payments", "email"]) as stack,
        Bus(settings) as bus,
    ):
        first = await procs.start("inventory", crash_at="adapter.before_publish")
        saga_id = await publish_start(bus, order_id)
        await crashed(first)
        reservations = await pool.fetchval(
            "SELECT count(*) FROM sim_inventory_reservations WHERE order_id = $1", order_id
        )
        assert reservations == 1  # the system was called; nobody heard about it

        await procs.start("inventory")
        state = await terminal(stack, saga_id)

    assert state.status == "completed"
    assert await effects(pool, order_id) == ONCE_EACH


async def test_failover_to_the_second_coordinator_after_sigkill(
    settings: Settings, procs: Processes, pool: asyncpg.Pool, order_id: str
) -> None:
    async with (
        Stack(settings, ["inventory", "erp", "payments", "email"]) as adapters,
        Bus(settings) as bus,
    ):
        active = await procs.start("coordinator")
        await asyncio.sleep(2)  # registered first: the single active consumer of every partition
        await procs.start("coordinator")
        sagas = [await publish_start(bus, f"{order_id}-{i}") for i in range(40)]
        await terminal(adapters, sagas[0])
        active.kill()
        await active.wait()
        later = [await publish_start(bus, f"{order_id}-late-{i}") for i in range(20)]
        states = [await terminal(adapters, s, seconds=30) for s in sagas + later]

    assert {s.status for s in states} == {"completed"}
    duplicated = await pool.fetchval(
        "SELECT count(*) FROM (SELECT idempotency_key FROM sim_effects WHERE order_id LIKE $1"
        " GROUP BY idempotency_key HAVING count(*) > 1) d",
        f"{order_id}%",
    )
    assert duplicated == 0


async def test_sigterm_finishes_the_message_in_hand(
    settings: Settings, procs: Processes, pool: asyncpg.Pool, order_id: str, tmp_path: Path
) -> None:
    """An ERP call that takes seconds (slow retries); SIGTERM arrives in the middle: the adapter
    finishes it and publishes its outcome before it exits, so the saga completes with no ERP
    process left running."""
    text = settings.catalog_file.read_text().replace(
        "initial_backoff_s = 0.02, max_backoff_s = 0.5",
        "initial_backoff_s = 1.0, max_backoff_s = 1.0",
    )
    catalog = tmp_path / "slow.toml"
    catalog.write_text(text)
    slow = settings.with_(catalog_path=str(catalog))
    procs.settings = slow
    from saga_services.faults import add_fault

    await add_fault(pool, "erp.create_credit_note", order_id, "transient:2")
    async with (
        Stack(slow, ["coordinator", "inventory", "payments", "email"]) as stack,
        Bus(slow) as bus,
    ):
        erp = await procs.start("erp")
        queue = bus.topology.action_queue("erp")
        await eventually(lambda: consumers_of(bus, queue), lambda n: n >= 1, seconds=60)
        saga_id = await publish_start(bus, order_id)
        await eventually(
            lambda: pool.fetchval("SELECT remaining FROM sim_faults WHERE order_id = $1", order_id),
            lambda left: left == 1,  # the first of the slow calls has happened
            seconds=60,
        )
        erp.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(erp.wait(), 60) == 0
        state = await terminal(stack, saga_id, seconds=60)

    assert state.status == "completed"
    assert state.steps[1].attempts == 3


async def test_a_process_started_while_the_broker_is_down_waits_for_it(
    settings: Settings, procs: Processes
) -> None:
    procs.settings = settings.with_(amqp_url="amqp://guest:guest@127.0.0.1:9/")  # nobody there
    proc = await procs.start("inventory")
    await asyncio.sleep(3)
    assert proc.returncode is None  # still waiting, not crashed into a restart loop
    proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(proc.wait(), 20) == 0
    log = next(procs.logs.glob("inventory-*.log")).read_text()
    assert "waiting for the broker and the database" in log
