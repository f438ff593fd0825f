"""Adapters handle the requests that arrive together as one batch: one statement (so one
transaction) for their calls, one confirm round for their outcomes, one ack. What each request
gets must not change: its own outcome, its own retries, its own failure."""

from __future__ import annotations

import asyncio

import aio_pika
import asyncpg
from aio_pika.abc import AbstractIncomingMessage

from saga_services.adapter import Adapter
from saga_services.errors import Permanent, Transient
from saga_services.faults import add_fault
from saga_services.registry import SYSTEMS
from saga_services.sdk import batch_scope
from saga_services.simulated import Simulated
from saga_services.store import Q
from saga_shared.config import Settings
from saga_shared.errors import InvalidMessage
from saga_shared.model.catalog import Catalog
from saga_shared.model.messages import ActionDone, ActionFailed, ActionRequest, PartitionMessage
from saga_shared.transport.bus import Bus
from saga_shared.transport.codec import PARTITION
from saga_shared.transport.delivery import Alone, InHand, deliver_batch
from tests.integration.test_adapter import RESERVE, reserve_request

INVENTORY = SYSTEMS["inventory"]


def orders(order_id: str, n: int) -> list[str]:
    return [f"{order_id}-{i}" for i in range(n)]


def negative(order_id: str) -> ActionRequest:
    req = reserve_request(order_id)
    return req.model_copy(update={"params": {"sku": "SKU-9", "quantity": -1}})


async def transactions_of(pool: asyncpg.Pool, keys: list[str]) -> int:
    """How many transactions wrote these keys' stored outcomes."""
    count: int = await pool.fetchval(
        "SELECT count(DISTINCT xmin::text) FROM service_keys WHERE key = ANY($1::text[])", keys
    )
    return count


async def test_a_batch_is_one_transaction_with_each_call_its_own_verdict(
    pool: asyncpg.Pool, order_id: str
) -> None:
    a, b, c = orders(order_id, 3)
    await add_fault(pool, RESERVE, b, "transient:1")
    reqs = [reserve_request(a), reserve_request(b), negative(c), reserve_request(a)]
    deps = Simulated("inventory", pool.acquire)
    async with batch_scope():  # as the adapter calls the functions of one delivery batch
        verdicts = await asyncio.gather(
            *(INVENTORY.call(req, deps) for req in reqs), return_exceptions=True
        )

    first, transient, refused, again = verdicts
    assert isinstance(first, dict) and str(first["reservation_id"]).startswith("res-")
    assert again == first  # the duplicate in the same batch gets the stored outcome
    assert isinstance(transient, Transient) and "injected transient fault" in str(transient)
    assert isinstance(refused, Permanent) and "quantity must be positive" in str(refused)
    assert await transactions_of(pool, [reqs[0].idempotency_key, reqs[2].idempotency_key]) == 1
    # The transient call stored nothing: run alone now, it lands.
    alone = await INVENTORY.call(reqs[1], deps)
    assert str(alone["reservation_id"]).startswith("res-")


async def take(bus: Bus, n: int) -> list[AbstractIncomingMessage]:
    """n deliveries of the inventory queue, in hand (not acked), as a consumer would hold them."""
    channel = await bus.connection.channel()
    queue = await channel.get_queue(bus.topology.action_queue("inventory"), ensure=False)
    taken: list[AbstractIncomingMessage] = []
    for _ in range(200):
        message = await queue.get(fail=False)
        if message is not None:
            taken.append(message)
        if len(taken) == n:
            return taken
        await asyncio.sleep(0.02)
    raise AssertionError(f"only {len(taken)} of {n} requests arrived")


async def outcomes(bus: Bus, n: int) -> dict[str, PartitionMessage]:
    """The next n outcomes in any partition, by order."""
    got: dict[str, PartitionMessage] = {}
    arrived = asyncio.Event()
    channel = await bus.connection.channel()

    async def on_message(message: AbstractIncomingMessage) -> None:
        outcome = PARTITION.validate_json(message.body)
        got[outcome.order_id] = outcome
        await message.ack()
        if len(got) == n:
            arrived.set()

    t = bus.topology
    for name in [*map(t.partition_queue, range(t.partitions)),
                 *map(t.outcome_queue, range(t.partitions))]:  # fmt: skip
        queue = await channel.get_queue(name, ensure=False)
        await queue.consume(on_message)
    try:
        await asyncio.wait_for(arrived.wait(), 20)
    finally:
        await channel.close()
    return got


async def test_an_adapter_batch_reports_each_request_and_retries_the_transient_alone(
    settings: Settings, catalog: Catalog, bus: Bus, pool: asyncpg.Pool, order_id: str
) -> None:
    fine, flaky, refused = orders(order_id, 3)
    await add_fault(pool, RESERVE, flaky, "transient:2")
    queue = bus.topology.actions_exchange
    for req in (reserve_request(fine), reserve_request(flaky), negative(refused)):
        await bus.publish(queue, "inventory", req)
    await bus.publish_raw(queue, "inventory", aio_pika.Message(b"[1]"))
    adapter = Adapter("inventory", settings, catalog, bus, pool)
    messages = await take(bus, 4)

    verdicts = await adapter.handle_batch(messages)
    assert verdicts[0] is None and verdicts[2] is None  # reported, to be acked together
    assert isinstance(verdicts[1], Alone) and verdicts[1].handler is not None
    assert isinstance(verdicts[3], InvalidMessage)
    await verdicts[1].handler(messages[1])  # what the consumer runs on its own
    got = await outcomes(bus, 3)

    first, second, third = got[fine], got[flaky], got[refused]
    assert isinstance(first, ActionDone) and first.tries == 1
    # The batch's call counts: two faults, then success on the third try, as one by one.
    assert isinstance(second, ActionDone) and second.tries == 3
    assert isinstance(third, ActionFailed) and not third.effect_unknown
    for message in messages:
        await message.reject(requeue=False)


async def test_a_batch_stuck_on_one_request_lets_the_others_through_alone(
    settings: Settings, catalog: Catalog, bus: Bus, pool: asyncpg.Pool, order_id: str
) -> None:
    """One call hangs (its key held by another transaction): the batch's statement times out,
    so every request goes alone; only the stuck one waits."""
    stuck, free = (reserve_request(o, timeout_s=0.5) for o in orders(order_id, 2))
    for req in (stuck, free):
        await bus.publish(bus.topology.actions_exchange, "inventory", req)
    adapter = Adapter("inventory", settings, catalog, bus, pool)
    messages = await take(bus, 2)
    spawned: list[asyncio.Task[None]] = []
    in_hand = InHand()
    for message in messages:
        in_hand.add(message)

    def spawn(message: AbstractIncomingMessage, handler: object) -> None:
        assert handler is None  # the consumer's own handler: the adapter's one by one
        spawned.append(asyncio.create_task(adapter.handle(message)))

    async with pool.acquire() as blocker:
        holding = blocker.transaction()
        await holding.start()
        await blocker.fetchval(
            Q.claim_key, stuck.idempotency_key, "inventory", RESERVE, stuck.order_id
        )
        await deliver_batch(messages, adapter.handle_batch, in_hand, spawn)
        assert len(spawned) == 2
        await asyncio.wait_for(asyncio.shield(spawned[1]), 10)
        assert not spawned[0].done()
        await holding.rollback()
    await asyncio.wait_for(spawned[0], 20)
    got = await outcomes(bus, 2)
    assert isinstance(got[free.order_id], ActionDone)
    assert isinstance(got[stuck.order_id], ActionDone)
