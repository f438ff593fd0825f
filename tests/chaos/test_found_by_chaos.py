"""An interleaving the 10,000-saga chaos run found (seed 100), replayed deterministically.

What happened there: an order's agent sent three starts. The intake forwarded start 2 to the
order's partition; before the coordinator applied it, the broker went down while the intake was
forwarding start 3. The intake's failure hook blocked the ORDER on start 3 (``retrying``). After
the restart, start 2 reached the coordinator and was parked behind that block; start 3 came back
with its command number and was parked too, "command 3 waits for command 2". Neither can ever
move: the order stays blocked for good, its running saga's outcomes and deadlines are parked
behind the block, nothing is dead-lettered and no operator is told.

Here the same interleaving is produced on purpose with the production pieces (the intake's
handler through ``saga_shared.transport.delivery.deliver``, the failure hook, the coordinator), on a
disposable
broker and database: start 1 is forwarded and not yet applied (the coordinator is not running
yet), then forwarding start 2 fails (its partition is unbound for that moment, so the mandatory
publish comes back unroutable, as a lost connection makes it fail), then everything runs
normally. Both sagas must then exist and the order must not stay blocked.

The fix (38e6c73) has two halves: the intake no longer blocks the order (prefetch 1 keeps the
commands in order instead), and a blocking message lifts its block on arrival even when it must
wait for its number. The failure hook here still blocks the order, as the intake's used to, so
the test pins the second half: any block whose message waits for its number must not deadlock.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import asyncpg
import pytest
from aio_pika.abc import AbstractIncomingMessage

from saga_coordinator.coordinator import Coordinator
from saga_coordinator.intake import Intake
from saga_coordinator.store import Store
from saga_shared.config import Settings
from saga_shared.model.gateway import load_catalog
from saga_shared.model.messages import StartSaga
from saga_shared.security.trust import forwarded_id
from saga_shared.storage.migrations import migrate
from saga_shared.transport.bus import Bus
from saga_shared.transport.codec import identify_incoming
from saga_shared.transport.delivery import Outcome, deliver
from saga_shared.transport.failures import Q
from tests.chaos.instances import DisposablePostgres, DisposableRabbit
from tests.integration.helpers import remove_namespace

ORDER = "ord-found-1"
REFUND = {"sku": "SKU-1", "quantity": 1, "amount_cents": 500, "customer_email": "a@example.com"}


@pytest.fixture
async def settings() -> AsyncIterator[Settings]:
    async with DisposablePostgres() as pg, DisposableRabbit() as rabbit:
        settings = Settings(
            amqp_url=rabbit.url(),
            database_url=pg.url("saga"),
            namespace="found",
            partitions=1,  # the order's partition is partition 0
            identity="shared",
        )
        await migrate(settings.database_url)
        yield settings


class OneAtATime:
    """Deliveries of a queue handed out one by one (a quorum queue with a single active
    consumer refuses ``basic.get``): prefetch 1, so the next comes once this one is settled."""

    def __init__(self) -> None:
        self.inbox: asyncio.Queue[AbstractIncomingMessage] = asyncio.Queue()

    async def on_message(self, message: AbstractIncomingMessage) -> None:
        await self.inbox.put(message)

    async def next(self) -> AbstractIncomingMessage:
        return await asyncio.wait_for(self.inbox.get(), 10)


@pytest.mark.timeout(120)
async def test_a_failed_forward_at_the_intake_does_not_deadlock_its_order(
    settings: Settings,
) -> None:
    catalog = load_catalog(settings.catalog_file)
    pool = await asyncpg.create_pool(settings.database_url, min_size=1, max_size=8)
    store = Store(pool)
    async with Bus(settings) as bus:
        await bus.declare()
        topology = bus.topology
        intake = Intake(settings, catalog, bus, store)

        # The intake's hook as it was when the chaos run found the deadlock: it blocks the order
        # (by the id the command reaches the partition under).
        async def on_failure(message: AbstractIncomingMessage, *_: object) -> None:
            key = forwarded_id(bus.user or "", identify_incoming(message).message_id)
            await pool.execute(Q.block_upsert, ORDER, key, "retrying", "its forward failed")

        starts = [
            StartSaga(saga_id=f"{ORDER}-s{n}", order_id=ORDER, saga="refund", params=REFUND)
            for n in (1, 2)
        ]
        for start in starts:  # the agent: start 2 once start 1 is confirmed
            await bus.publish(topology.commands_exchange, start.type, start)

        channel = await bus.connection.channel()
        await channel.set_qos(prefetch_count=1)
        intake_queue = await channel.get_queue(topology.intake_queue, ensure=False)
        partition = await channel.get_queue(topology.partition_queue(0), ensure=False)
        partitions = await channel.get_exchange(topology.partitions_exchange, ensure=False)
        deliveries = OneAtATime()
        await intake_queue.consume(deliveries.on_message)

        # Start 1 is forwarded; the coordinator has not applied it yet (it is not running).
        assert await deliver(await deliveries.next(), intake.handle, on_failure) is Outcome.ACK
        # Forwarding start 2 fails: its failure blocks the order, and it goes back to the queue.
        await partition.unbind(partitions, routing_key="0")
        outcome = await deliver(await deliveries.next(), intake.handle, on_failure)
        assert outcome is Outcome.RETRY
        await partition.bind(partitions, routing_key="0")
        await channel.close()  # whatever this consumer holds goes back to the queue

        # From here on everything works: the intake forwards start 2 again, the coordinator runs.
        runners = [
            asyncio.create_task(intake.run()),
            asyncio.create_task(Coordinator(settings, catalog, bus, store).run()),
        ]
        try:
            state = await wait_for_both_sagas(pool, [s.saga_id for s in starts], seconds=30)
        finally:
            for runner in runners:
                runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*runners, return_exceptions=True)
            await pool.close()
    await remove_namespace(settings)
    assert state["sagas"] == 2, f"the order deadlocked: {state}"
    assert state["blocks"] == [], f"the order stays blocked: {state}"


async def wait_for_both_sagas(
    pool: asyncpg.Pool, saga_ids: list[str], seconds: float
) -> dict[str, object]:
    deadline = time.monotonic() + seconds
    while True:
        sagas = await pool.fetchval("SELECT count(*) FROM sagas WHERE saga_id = ANY($1)", saga_ids)
        blocks = await pool.fetch(
            "SELECT message_id, state, reason FROM order_blocks WHERE order_id = $1", ORDER
        )
        parked = await pool.fetch(
            "SELECT message_id, message_type, reason FROM parked WHERE order_id = $1 ORDER BY id",
            ORDER,
        )
        state: dict[str, object] = {
            "sagas": sagas,
            "blocks": [dict(b) for b in blocks],
            "parked": [dict(p) for p in parked],
        }
        if (sagas == len(saga_ids) and not blocks) or time.monotonic() > deadline:
            return state
        await asyncio.sleep(0.2)
