"""Partitions owned through Postgres session locks, against the real Postgres and RabbitMQ: one
owner at a time, passed on when it dies or freezes, and a partition taken sends again what its
running steps have out (docs/explanation/design.md, "Who owns a partition")."""

from __future__ import annotations

import asyncio
from pathlib import Path

import asyncpg
import pytest

from saga_app.stack import Stack
from saga_coordinator.ownership import Change, Ownership
from saga_coordinator.relay import Relay
from saga_shared.config import Settings
from saga_shared.storage.sql import create_pool
from saga_shared.transport.bus import Bus
from tests.integration.helpers import eventually, publish_start, remove_namespace, terminal
from tests.integration.test_request_queues import holding, lose, patient

EVERY = [0, 1, 2, 3]


async def test_a_partition_has_one_owner_and_passes_on_when_its_owner_dies_or_freezes(
    settings: Settings,
) -> None:
    fast = settings.with_(standby_after_s=0.3, partition_lease_s=1.0)
    a, b = Ownership(fast, fast.database_url), Ownership(fast, fast.database_url)
    other = Ownership(fast.with_(namespace=f"{fast.namespace}-x"), fast.database_url)
    try:
        assert await a.look([], EVERY, []) == Change(start=frozenset(EVERY),
                                                     resend=frozenset(EVERY))  # fmt: skip
        assert await b.look([], [], EVERY) == Change()  # standing by: not yet
        await asyncio.sleep(0.4)
        assert await b.look([], [], EVERY) == Change()  # a holds them all
        # Another namespace's partitions are locks of their own.
        assert (await other.look([], [0], [])).start == {0}

        await a.close()  # a process that dies ends its session
        assert (await b.look([], [], EVERY)).start == set(EVERY)

        # b freezes: no look for longer than its lease; the server ends its session.
        await asyncio.sleep(1.5)
        assert (await a.look([], EVERY, [])).start == set(EVERY)
        # Woken, b finds its session gone (at once, or at the look that uses it) and stops
        # consuming what a holds now.
        woken = [await b.look(EVERY, [], EVERY) for _ in range(2)]
        assert {p for look in woken for p in look.stop} == set(EVERY)
        assert all(not look.start for look in woken)
    finally:
        for held in (a, b, other):
            await held.close()


async def test_a_coordinator_that_starts_sends_again_what_was_lost_while_it_was_down(
    settings: Settings, tmp_path: Path
) -> None:
    """The coordinator is down when the inventory's request queue goes with its request in it;
    it starts, declares the queue again (so no look of its watch finds it gone), and takes its
    partitions: the request is sent again at once, uncounted (the step may be sent 21 times,
    not 20), rather than by its deadline."""
    fast = patient(settings, tmp_path)
    first = Stack(fast, ["coordinator", "erp", "payments", "email"])
    inventory = Stack(fast, ["inventory"])
    await first.start()
    second: Stack | None = None
    try:
        async with Bus(fast) as bus:
            queue = bus.topology.request_queue("inventory")
            saga = await publish_start(bus, "order-lost-while-down")
            await eventually(lambda: bus.depths([queue]), holding(queue, 1))
            await first.stop()
            await lose(bus, queue)
        second = Stack(fast, ["coordinator", "erp", "payments", "email"])
        await second.start()
        await inventory.start()
        state = await terminal(second, saga)
    finally:
        await inventory.stop()
        if second is not None:
            await second.stop()
        await first.stop()
        await remove_namespace(fast)

    assert state.status == "completed"
    assert state.steps[0].max_sends == 21


async def test_a_frozen_relay_and_a_frozen_transaction_let_go_after_the_lease(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    """What a frozen coordinator holds in Postgres passes after ``SAGA_PARTITION_LEASE_S``: the
    relay's lock (its rows would otherwise wait for it to wake), and the row locks of a
    transaction it had open (every other process would otherwise wait on them)."""
    fast = settings.with_(partition_lease_s=1.0)
    bus = Bus(fast)  # the lead needs no broker
    first, second = Relay(fast, pool, bus), Relay(fast, pool, bus)
    frozen = await create_pool(fast.database_url, min_size=1, max_size=1,
                               idle_in_transaction_s=fast.lease_s)  # fmt: skip
    try:
        assert await first._lead() is not None
        assert await second._lead() is None
        await asyncio.sleep(1.5)  # first frozen: no statement for longer than the lease
        assert await second._lead() is not None

        key = f"frozen-{fast.namespace}"
        async with frozen.acquire() as conn:
            transaction = conn.transaction()
            await transaction.start()
            await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", key)
            await asyncio.sleep(1.5)  # frozen inside its transaction
            taken = await pool.fetchval("SELECT pg_try_advisory_xact_lock(hashtext($1))", key)
            with pytest.raises((asyncpg.PostgresError, asyncpg.InterfaceError)):
                await conn.execute("SELECT 1")  # woken: its session was ended
        assert taken is True
    finally:
        for relay in (first, second):
            if relay._conn is not None:
                await relay._conn.close()
        frozen.terminate()
