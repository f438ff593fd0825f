"""A flood of commands: the coordinator commits no faster than it publishes what it committed,
so the messages waiting to go out stay bounded, and every one goes out."""

from __future__ import annotations

import asyncio
import contextlib

import asyncpg

from saga_app.stack import Stack
from saga_shared.config import Settings
from saga_shared.model.messages import Gate, Plan, PlanStep, StartSaga
from saga_shared.transport.bus import Bus
from saga_shared.transport.codec import message_to_amqp
from tests.integration.helpers import eventually, remove_namespace

GATED = Plan(steps=(PlanStep(action="inventory.reserve_stock", gate=Gate()),))
COMMANDS = 3000


async def _most_in_outbox(settings: Settings, highest: list[int]) -> None:
    conn = await asyncpg.connect(settings.database_url)
    try:
        while True:
            count = await conn.fetchval(
                "SELECT count(*) FROM outbox WHERE left(exchange, length($1)) = $1",
                f"{settings.namespace}.",
            )
            highest[0] = max(highest[0], count)
            await asyncio.sleep(0.01)
    finally:
        await conn.close()


async def test_a_flood_of_commands_is_committed_no_faster_than_its_events_go_out(
    settings: Settings,
) -> None:
    settings = settings.with_(partition_batch=4, agent_rate=1e6, agent_burst=1_000_000)
    most = settings.partitions * settings.partition_batch  # messages in one group commit
    stack = Stack(settings)
    await stack.start()
    highest = [0]
    try:
        async with Bus(settings) as bus:
            channel = await bus.connection.channel()
            events = await channel.declare_queue(exclusive=True)
            await events.bind(bus.topology.events_exchange, "saga.awaiting_approval")
            t = bus.topology
            starts = [
                StartSaga(
                    saga_id=f"flood-{i}",
                    order_id=f"flood-o{i}",
                    plan=GATED,
                    params={"sku": "SKU-1", "quantity": 1},
                )
                for i in range(COMMANDS)
            ]
            items = [(t.commands_exchange, t.command_key(s.type, s.order_id),
                      message_to_amqp(s)) for s in starts]  # fmt: skip
            sampling = asyncio.create_task(_most_in_outbox(settings, highest))
            for i in range(0, len(items), 500):
                assert not any(await bus.publish_many(items[i : i + 500]))

            underlay = await channel.get_underlay_channel()

            async def announced() -> int:
                declared = await underlay.queue_declare(events.name, passive=True)
                return declared.message_count or 0

            await eventually(announced, lambda n: n >= COMMANDS, seconds=120)
            sampling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampling
            assert await announced() == COMMANDS  # each event once: none sent again
    finally:
        await stack.stop()
        await remove_namespace(settings)
    # Two events a start. Waiting for a round: at most a group's worth before a group, plus
    # the group's; as many in the round being confirmed, and in confirmed rounds whose rows
    # the next group deletes. Without the wait it held thousands (the whole flood's events).
    assert highest[0] <= 12 * most, f"{highest[0]} outbox rows at once"
