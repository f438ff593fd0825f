"""The adapter against the real Postgres, and end to end over the real RabbitMQ."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import subprocess
from collections.abc import AsyncIterator

import aio_pika
import aiormq
import asyncpg
import pytest
from aio_pika.abc import AbstractIncomingMessage
from pydantic import JsonValue

from saga_services.adapter import Adapter
from saga_services.effects import effects_for_order
from saga_services.faults import add_fault
from saga_services.store import Q
from saga_shared.config import Settings
from saga_shared.errors import RetryLater
from saga_shared.model.catalog import Catalog
from saga_shared.model.messages import ActionDone, ActionFailed, ActionRequest, PartitionMessage
from saga_shared.transport.bus import Bus, refused_for_now
from saga_shared.transport.codec import PARTITION
from saga_shared.transport.topology import partition_of

RESERVE = "inventory.reserve_stock"
PARAMS: dict[str, JsonValue] = {"sku": "SKU-9", "quantity": 3}


def reserve_request(order_id: str, *, timeout_s: float = 5, attempt: int = 1) -> ActionRequest:
    return ActionRequest(
        saga_id=f"saga-{order_id}",
        order_id=order_id,
        action=RESERVE,
        phase="forward",
        step=0,
        idempotency_key=f"saga-{order_id}:{RESERVE}",
        params=PARAMS,
        attempt=attempt,
        timeout_s=timeout_s,
    )


@pytest.fixture
def adapter(settings: Settings, catalog: Catalog, pool: asyncpg.Pool) -> Adapter:
    # perform() never touches the broker, so an unconnected bus is enough here.
    return Adapter("inventory", settings, catalog, Bus(settings), pool)


# --- retries, without the broker -----------------------------------------------------------------


async def test_transient_failures_are_retried(
    adapter: Adapter, pool: asyncpg.Pool, order_id: str
) -> None:
    await add_fault(pool, RESERVE, order_id, "transient:2")
    outcome = await adapter.perform(reserve_request(order_id))

    assert isinstance(outcome, ActionDone)
    assert outcome.tries == 3
    assert [e["times"] for e in (await effects_for_order(pool, order_id))["applied"]] == [1]


async def test_exhausted_retries_report_an_unknown_effect(
    adapter: Adapter, pool: asyncpg.Pool, order_id: str
) -> None:
    await add_fault(pool, RESERVE, order_id, "transient:10")
    outcome = await adapter.perform(reserve_request(order_id))

    assert isinstance(outcome, ActionFailed)
    assert outcome.effect_unknown is True
    assert outcome.tries == 4  # the catalog's retry.attempts for this action
    assert "injected transient fault" in outcome.reason


async def test_permanent_failure_is_reported_once_and_certain(
    adapter: Adapter, pool: asyncpg.Pool, order_id: str
) -> None:
    await add_fault(pool, RESERVE, order_id, "permanent")
    outcome = await adapter.perform(reserve_request(order_id))

    assert isinstance(outcome, ActionFailed)
    assert outcome.effect_unknown is False
    assert outcome.tries == 1
    assert outcome.reason == f"injected permanent fault on {RESERVE}"


async def test_a_timeout_counts_as_transient(
    adapter: Adapter, pool: asyncpg.Pool, order_id: str
) -> None:
    req = reserve_request(order_id, timeout_s=0.2)
    # Another transaction holding the key makes the call hang, as a slow system would.
    async with pool.acquire() as blocker:
        holding = blocker.transaction()
        await holding.start()
        await blocker.fetchval(Q.claim_key, req.idempotency_key, "inventory", RESERVE, order_id)
        outcome = await adapter.perform(req)
        await holding.rollback()
    after = await adapter.perform(req.model_copy(update={"attempt": 2}))

    assert isinstance(outcome, ActionFailed)
    assert outcome.effect_unknown is True
    assert outcome.tries == 4
    assert "no answer within 0.2s" in outcome.reason
    assert isinstance(after, ActionDone)


async def test_unreachable_database_means_retry_later(
    settings: Settings, catalog: Catalog, order_id: str
) -> None:
    # Port 1 refuses connections; min_size=0 keeps the pool from connecting up front.
    dead = await asyncpg.create_pool("postgresql://postgres@127.0.0.1:1/none", min_size=0)
    try:
        adapter = Adapter("inventory", settings, catalog, Bus(settings), dead, db_retry_s=0.3)
        with pytest.raises(RetryLater, match="database unreachable"):
            await adapter.perform(reserve_request(order_id))
    finally:
        await dead.close()


# --- end to end over RabbitMQ --------------------------------------------------------------------


@pytest.fixture
async def running(
    settings: Settings, catalog: Catalog, bus: Bus, pool: asyncpg.Pool
) -> AsyncIterator[Adapter]:
    adapter = Adapter("inventory", settings, catalog, bus, pool)
    task = asyncio.create_task(adapter.run())
    yield adapter
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


@contextlib.asynccontextmanager
async def partition_reader(
    bus: Bus, order_id: str
) -> AsyncIterator[asyncio.Queue[PartitionMessage]]:
    """Collect what arrives in the order's partition, its quorum queue and its outcome queue (a
    single-active-consumer quorum queue refuses basic.get, so consume)."""
    received: asyncio.Queue[PartitionMessage] = asyncio.Queue()
    index = partition_of(order_id, bus.topology.partitions)
    channel = await bus.connection.channel()

    async def on_message(message: AbstractIncomingMessage) -> None:
        received.put_nowait(PARTITION.validate_json(message.body))
        await message.ack()

    for name in (bus.topology.partition_queue(index), bus.topology.outcome_queue(index)):
        queue = await channel.get_queue(name, ensure=False)
        await queue.consume(on_message)
    try:
        yield received
    finally:
        await channel.close()


async def test_adapter_end_to_end(
    running: Adapter, bus: Bus, pool: asyncpg.Pool, order_id: str
) -> None:
    req = reserve_request(order_id)
    async with partition_reader(bus, order_id) as received:
        await bus.publish(bus.topology.actions_exchange, "inventory", req)
        first = await asyncio.wait_for(received.get(), 15)
        await bus.publish(bus.topology.actions_exchange, "inventory", req)  # a redelivery
        again = await asyncio.wait_for(received.get(), 15)

    assert isinstance(first, ActionDone)
    assert isinstance(again, ActionDone)
    assert (first.saga_id, first.order_id, first.idempotency_key, first.step) == (
        req.saga_id, order_id, req.idempotency_key, 0
    )  # fmt: skip
    assert str(first.result["reservation_id"]).startswith("res-")
    assert again.result == first.result
    assert again.message_id == first.message_id  # the coordinator's inbox absorbs it
    effects = await effects_for_order(pool, order_id)
    assert len(effects["reservations"]) == 1
    assert [e["times"] for e in effects["applied"]] == [1]


async def test_malformed_request_is_dead_lettered(
    running: Adapter, bus: Bus, order_id: str
) -> None:
    await bus.publish_raw(
        bus.topology.actions_exchange, "inventory", aio_pika.Message(b"{not json", message_id="m1")
    )
    channel = await bus.connection.channel()
    try:
        dead = await channel.get_queue(bus.topology.dead_letter_queue, ensure=False)
        letter = None
        for _ in range(100):
            letter = await dead.get(fail=False, no_ack=True)
            if letter is not None:
                break
            await asyncio.sleep(0.1)
    finally:
        await channel.close()

    assert letter is not None
    assert letter.body == b"{not json"
    # The adapter lives on and handles the next request.
    async with partition_reader(bus, order_id) as received:
        await bus.publish(bus.topology.actions_exchange, "inventory", reserve_request(order_id))
        assert isinstance(await asyncio.wait_for(received.get(), 15), ActionDone)


@contextlib.asynccontextmanager
async def refusing(bus: Bus, order_id: str) -> AsyncIterator[None]:
    """The broker nacks every outcome to the order's partition while this lasts, which is how a
    queue answers that cannot take more (a quorum queue without a majority of its nodes, a
    memory alarm): a policy of length 1 with reject-publish overflow on its outcome queue, and
    ``filler`` messages until the broker refuses one (the policy takes a moment to apply)."""
    queue = bus.topology.outcome_queue(partition_of(order_id, bus.topology.partitions))
    pattern = f"^{re.escape(queue)}$"
    name = f"refuse-{queue}"
    definition = json.dumps({"max-length": 1, "overflow": "reject-publish"})
    ctl = ("rabbitmqctl", "-q", "set_policy", "--apply-to", "queues", name, pattern, definition)
    await asyncio.to_thread(subprocess.run, ctl, check=True, capture_output=True, timeout=60)
    try:
        for _ in range(100):
            try:
                await bus.publish_raw(*bus.for_outcome(filler(order_id)))
            except aiormq.exceptions.DeliveryError as exc:
                if not refused_for_now(exc):
                    raise
                break
            await asyncio.sleep(0.05)
        yield
    finally:
        clear = ("rabbitmqctl", "-q", "clear_policy", name)
        await asyncio.to_thread(subprocess.run, clear, check=True, capture_output=True, timeout=60)


def filler(order_id: str) -> ActionDone:
    return ActionDone(saga_id="filler", order_id=order_id, action=RESERVE, phase="forward",
                      step=0, idempotency_key="filler", result={})  # fmt: skip


async def test_an_outcome_the_broker_refuses_for_a_while_keeps_its_request_in_hand(
    settings: Settings, catalog: Catalog, bus: Bus, pool: asyncpg.Pool, order_id: str
) -> None:
    """Requeueing the request at each refusal would burn all its delivery attempts in well
    under a second; held in hand, it outlives a refusal of several seconds and its outcome is
    published once the queue takes it."""
    adapter = Adapter("inventory", settings, catalog, bus, pool)
    req = reserve_request(order_id)
    task = asyncio.create_task(adapter.run())
    try:
        async with refusing(bus, order_id):
            await bus.publish(bus.topology.actions_exchange, "inventory", req)
            for _ in range(100):  # until the call has landed and its outcome was refused
                if (await effects_for_order(pool, order_id))["applied"]:
                    break
                await asyncio.sleep(0.1)
            await asyncio.sleep(3)
        async with partition_reader(bus, order_id) as received:
            outcome = await asyncio.wait_for(received.get(), 15)
            while outcome.saga_id == "filler":
                outcome = await asyncio.wait_for(received.get(), 15)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    assert isinstance(outcome, ActionDone)
    assert outcome.idempotency_key == req.idempotency_key
    assert [e["times"] for e in (await effects_for_order(pool, order_id))["applied"]] == [1]
    channel = await bus.connection.channel()
    try:
        dead = await channel.get_queue(bus.topology.dead_letter_queue, ensure=False)
        assert await dead.get(fail=False, no_ack=True) is None
    finally:
        await channel.close()
