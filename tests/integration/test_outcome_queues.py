"""Outcomes travel as transient messages through a classic, non-durable queue per partition,
against the real RabbitMQ: the services' key records answer them again, so losing the queue
costs a resend, never a saga; a redelivered outcome is moved to the partition's quorum queue,
which counts its deliveries (docs/explanation/design.md, "Two kinds of queue")."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aio_pika
import asyncpg
from aio_pika.abc import AbstractIncomingMessage

from saga_app.stack import Stack
from saga_shared.config import Settings
from saga_shared.errors import RetryLater
from saga_shared.security.trust import MOVED_HEADER
from saga_shared.transport.bus import Bus
from tests.integration.helpers import eventually, publish_start, remove_namespace, terminal
from tests.integration.test_request_queues import broker_queues, lose, patient


async def test_outcomes_go_through_each_partitions_classic_transient_queue(
    settings: Settings, tmp_path: Path, order_id: str
) -> None:
    """Each partition has a classic, non-durable outcome queue beside its quorum queue; a
    saga's outcomes reach the coordinator through it."""
    stack = Stack(settings, ["coordinator", "inventory", "erp", "payments", "email"])
    await stack.start()
    try:
        async with Bus(settings) as bus:
            t = bus.topology
            channel = await bus.connection.channel()
            tap = await channel.declare_queue(exclusive=True)
            await tap.bind(t.outcomes_exchange, routing_key=t.partition_key(order_id))
            saga = await publish_start(bus, order_id)
            assert (await terminal(stack, saga)).status == "completed"
            copy = await tap.get(timeout=10)
            await channel.close()
    finally:
        await stack.stop()
    queues = await asyncio.to_thread(broker_queues, settings.namespace)
    await remove_namespace(settings)

    assert copy.type == "action.done"
    for p in range(settings.partitions):
        assert (queues[t.outcome_queue(p)]["type"],
                queues[t.outcome_queue(p)]["durable"]) == ("classic", False)  # fmt: skip
        assert queues[t.partition_queue(p)]["type"] == "quorum"


async def _hold_outcomes(bus: Bus) -> tuple[aio_pika.abc.AbstractChannel, list[str]]:
    """A consumer on every outcome queue before the coordinator's: the queues have a single
    active consumer, so it takes every outcome and the coordinator's consumer stands by. It
    never settles them."""
    await bus.declare()
    channel = await bus.connection.channel()
    await channel.set_qos(prefetch_count=100)
    held: list[str] = []

    async def keep(message: AbstractIncomingMessage) -> None:
        held.append(message.message_id or "")

    for p in range(bus.topology.partitions):
        queue = await channel.get_queue(bus.topology.outcome_queue(p), ensure=False)
        await queue.consume(keep)
    return channel, held


async def test_outcomes_lost_with_their_queue_are_asked_again_and_every_saga_completes(
    settings: Settings, tmp_path: Path, pool: asyncpg.Pool, order_id: str
) -> None:
    """Five sagas' first outcomes sit in their outcome queues, held by another consumer, and the
    queues are deleted with them, as their node going down deletes them. The running
    coordinator's watch finds them gone, declares them again and sends each running request
    again at once, uncounted (the step's budget grows by one); the inventory answers from its
    key record, and every saga completes with one reservation each, none dead-lettered."""
    fast = patient(settings, tmp_path)
    stack = Stack(fast, ["coordinator", "inventory", "erp", "payments", "email"])
    async with Bus(fast) as bus:
        t = bus.topology
        channel, held = await _hold_outcomes(bus)
        await stack.start()
        try:
            sagas = [await publish_start(bus, f"{order_id}-{i}") for i in range(5)]
            await eventually(lambda: asyncio.sleep(0, len(held)), lambda n: n >= 5)
            for p in range(t.partitions):
                await lose(bus, t.outcome_queue(p))
            states = [await terminal(stack, s) for s in sagas]
        finally:
            await channel.close()
            await stack.stop()
            await remove_namespace(fast)

    assert [s.status for s in states] == ["completed"] * 5
    # One send more than the catalog's 20: the resend after the loss was not counted.
    assert all(s.steps[0].max_sends == 21 and s.steps[0].sends == 2 for s in states)
    reserved = await pool.fetchval(
        "SELECT count(*) FROM sim_inventory_reservations WHERE order_id LIKE $1", f"{order_id}-%"
    )
    assert reserved == 5  # the request sent again was answered from the key record
    dead = await pool.fetchval(
        "SELECT count(*) FROM dead_letters WHERE order_id LIKE $1", f"{order_id}-%"
    )
    assert dead == 0


async def test_a_redelivered_outcome_is_moved_to_its_partitions_quorum_queue(
    settings: Settings, order_id: str
) -> None:
    """An outcome handed out before (here to a consumer that closed without settling it) comes
    back redelivered: the coordinator moves it to the partition's quorum queue, which counts
    its deliveries as the classic queue cannot, naming its first sender, and handles it there:
    the saga completes with no resend."""
    stack = Stack(settings, ["coordinator", "inventory", "erp", "payments", "email"])
    async with Bus(settings) as bus:
        t = bus.topology
        channel, held = await _hold_outcomes(bus)
        tap_channel = await bus.connection.channel()
        tap = await tap_channel.declare_queue(exclusive=True)
        await tap.bind(t.partitions_exchange, routing_key=t.partition_key(order_id))
        await stack.start()
        try:
            saga = await publish_start(bus, order_id)
            await eventually(lambda: asyncio.sleep(0, len(held)), lambda n: n >= 1)
            await channel.close()  # unsettled: back in the queue, redelivered
            state = await terminal(stack, saga)
            moved = []
            while (copy := await tap.get(timeout=5, fail=False)) is not None:
                if MOVED_HEADER in (copy.headers or {}):
                    moved.append(copy)
            await tap_channel.close()
        finally:
            await stack.stop()
            await remove_namespace(settings)

    assert state.status == "completed"
    assert all(s.sends == 1 for s in state.steps)
    assert [m.message_id for m in moved] == held[:1]
    assert moved[0].headers[MOVED_HEADER] == bus.user  # the adapter's, as the broker checked it


async def test_an_outcome_whose_handling_failed_and_whose_queue_went_holds_no_order(
    settings: Settings, pool: asyncpg.Pool, order_id: str
) -> None:
    """The coordinator fails on a saga's first outcome (the database away, say), and the outcome
    queue goes with the outcome before it is handed back (a broker restart). A block waiting for
    that outcome would hold the order for ever (55 orders in a 10,000-saga chaos run): an
    outcome's failure blocks nothing, the watch's resend brings the answer again, and the saga
    completes with its order free."""
    stack = Stack(settings, ["coordinator", "inventory", "erp", "payments", "email"])
    await stack.start()
    failed: list[str] = []
    try:
        async with Bus(settings) as bus:
            t = bus.topology
            coordinator = stack.coordinator
            assert coordinator is not None
            handle = coordinator.handle

            async def fail_first(delivery: AbstractIncomingMessage, partition: int) -> None:
                if delivery.exchange == t.outcomes_exchange and not failed:
                    failed.append(delivery.message_id or "")
                    await lose(bus, t.outcome_queue(partition))
                    raise RetryLater("the database is away")
                await handle(delivery, partition)

            coordinator.handle = fail_first  # type: ignore[method-assign]
            saga = await publish_start(bus, order_id)
            state = await terminal(stack, saga)
    finally:
        await stack.stop()
        await remove_namespace(settings)

    assert len(failed) == 1
    assert state.status == "completed"
    blocks = await pool.fetchval("SELECT count(*) FROM order_blocks WHERE order_id = $1", order_id)
    assert blocks == 0
