"""Garbage can never block an order or wedge a process: a seeded fuzz of mutated commands,
envelopes and outcomes against the stack running as real processes, every role on its own
account. Every message is accounted for; afterwards a normal refund of every touched order
completes, the dead-letter queue is empty, no process exited and the logs stayed small.

``SAGA_FUZZ_COUNT`` sets the number of messages (default 10,000), ``SAGA_FUZZ_SEED`` the seed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections import Counter
from pathlib import Path

import aio_pika
import aiormq
import asyncpg
import pytest

from saga_shared.client import SagaClient
from saga_shared.config import Settings
from saga_shared.security.trust import forwarded_id
from saga_shared.transport.bus import Bus
from saga_shared.transport.codec import peek
from saga_shared.transport.topology import partition_of
from tests.chaos.processes import Supervisor
from tests.integration.deployment import Deployment
from tests.integration.fuzz import Fuzzer, Shot, run_id
from tests.integration.helpers import REFUND, eventually, saga_env

COUNT = int(os.environ.get("SAGA_FUZZ_COUNT", "10000"))
SEED = int(os.environ.get("SAGA_FUZZ_SEED", "2026"))
ORDERS = 60
LOG_BOUND = 4 * 1024 * 1024  # bytes of log, all processes together


async def publish(bus: Bus, shot: Shot, settings: Settings) -> bool:
    """Publish one shot with a confirm; False when the broker refused it or could route it
    nowhere (it reached no queue)."""
    message = aio_pika.Message(shot.body, message_id=shot.message_id, headers=shot.headers)
    if shot.target == "commands":
        exchange, key = bus.topology.commands_exchange, shot.routing_key
    else:
        order = peek(shot.body)["order_id"]
        exchange = bus.topology.partitions_exchange
        key = str(partition_of(order, settings.partitions)) if order else shot.routing_key
    try:
        await bus.publish_raw(exchange, key, message)
    except (aiormq.exceptions.ChannelAccessRefused, aiormq.exceptions.DeliveryError):
        return False  # a key the agent may not use, or one no queue is bound to
    return True


async def fate(pool: asyncpg.Pool, shots: list[Shot], agent: str) -> dict[str, set[int]]:
    """What became of each shot: rejected, dead-lettered, or handled by the coordinator."""
    ids = [s.message_id for s in shots]
    rejected = {r[0] for r in await pool.fetch(
        "SELECT transport_id FROM rejections WHERE transport_id = ANY($1)", ids)}  # fmt: skip
    dead = {r[0] for r in await pool.fetch(
        "SELECT transport_id FROM dead_letters WHERE transport_id = ANY($1)", ids)}  # fmt: skip
    keys: dict[str, list[int]] = {}
    for shot in shots:
        # a message without an id in its body takes its AMQP message-id
        body_id = peek(shot.body)["message_id"] or shot.message_id
        key = forwarded_id(agent, body_id) if shot.target == "commands" else body_id
        keys.setdefault(key, []).append(shot.index)
    handled_keys = {r[0] for r in await pool.fetch(
        "SELECT message_id FROM inbox WHERE message_id = ANY($1)", list(keys))}  # fmt: skip
    by_id = {s.message_id: s.index for s in shots}
    return {
        "rejected": {by_id[i] for i in rejected},
        "dead": {by_id[i] for i in dead},
        "handled": {i for k in handled_keys for i in keys[k]},
    }


async def queue_depth(bus: Bus, queue: str) -> int:
    channel = await bus.connection.channel()
    try:
        found = await channel.declare_queue(queue, passive=True)
        return found.declaration_result.message_count or 0
    finally:
        await channel.close()


@pytest.mark.timeout(900)
async def test_a_seeded_fuzz_is_accounted_for_and_blocks_no_order(
    deployment: Deployment, role_settings: Settings, pool: asyncpg.Pool, tmp_path: Path
) -> None:
    run = run_id()
    settings = role_settings.with_(agent_rate=1e6, agent_burst=1_000_000)
    orders = [f"fz-{run}-o{k}" for k in range(ORDERS)]
    fuzzer = Fuzzer(SEED, run, orders, settings.partitions)
    env = saga_env(settings) | {"SAGA_AGENT_RATE": "1000000", "SAGA_AGENT_BURST": "1000000",
                                "SAGA_AGENTS": settings.agents}  # fmt: skip
    components = {n: n for n in ("coordinator", "inventory", "erp", "payments", "email")}
    supervisor = Supervisor(env, tmp_path / "logs", say=print, components=components)
    await supervisor.start_all()
    agent, inventory = deployment.user("agent"), deployment.user("inventory")
    try:
        async with (
            Bus(settings, user=agent) as agent_bus,
            Bus(settings, user=inventory) as inventory_bus,
            Bus(settings, user=deployment.user("coordinator")) as coordinator_bus,
        ):
            await _ready(coordinator_bus)
            replies = await (await agent_bus.connection.channel()).declare_queue(exclusive=True)
            fuzzer.reply_to = replies.name
            shots = list(fuzzer.shots(COUNT))
            refused: set[int] = set()  # by the broker: these reached no queue
            for shot in shots:
                bus = agent_bus if shot.target == "commands" else inventory_bus
                if not await publish(bus, shot, settings):
                    refused.add(shot.index)
            reached = COUNT - len(refused)

            async def accounted() -> int:
                found = await fate(pool, shots, agent)
                return len(found["rejected"] | found["dead"] | found["handled"])

            with contextlib.suppress(AssertionError):  # the assertions below name what is missing
                await eventually(accounted, lambda n: n >= reached, seconds=240)
            found = await fate(pool, shots, agent)
            await eventually(
                lambda: queue_depth(coordinator_bus, coordinator_bus.topology.dead_letter_queue),
                lambda n: n == 0,
            )
            last_resort = await queue_depth(
                coordinator_bus, coordinator_bus.topology.last_resort_queue
            )
            blocked = await pool.fetch(
                "SELECT order_id, message_id, state, reason FROM order_blocks"
                " WHERE order_id = ANY($1)",
                orders,
            )
            await _abort_what_waits_for_a_person(pool, settings, deployment, orders)
            completed = await _refund_every_order(settings, agent, orders)
    finally:
        graceful = await supervisor.stop_all()
    logs = {p.name: p.stat().st_size for p in (tmp_path / "logs").glob("*.log")}
    accounted_for = found["rejected"] | found["dead"] | found["handled"]
    by_fate = Counter(
        "refused by the broker" if s.index in refused else "rejected"
        if s.index in found["rejected"] else "dead-lettered" if s.index in found["dead"]
        else "handled" if s.index in found["handled"] else "unaccounted" for s in shots
    )  # fmt: skip
    print(f"fuzz seed {SEED}: {COUNT} sent, {dict(by_fate)}, logs {sum(logs.values())} bytes")

    missing = [s for s in shots if s.index not in accounted_for and s.index not in refused]
    assert len(accounted_for) == reached, [
        (s.index, s.target, s.mutation, s.routing_key, s.headers, s.body[:300]) for s in missing
    ][:20]
    assert supervisor.exits == [], [e.log_tail for e in supervisor.exits]
    assert all(graceful.values()), graceful
    assert blocked == [], [dict(b) for b in blocked][:6]
    assert last_resort == 0
    assert completed == len(orders)
    assert sum(logs.values()) < LOG_BOUND, logs


async def _ready(bus: Bus) -> None:
    """The coordinator process is consuming its intake (it declared the topology first)."""

    async def consumers() -> int:
        channel = await bus.connection.channel()
        try:
            queue = await channel.declare_queue(bus.topology.intake_queue, passive=True)
            return queue.declaration_result.consumer_count or 0
        except aiormq.exceptions.ChannelNotFoundEntity:
            return 0
        finally:
            if not channel.is_closed:
                await channel.close()

    await eventually(consumers, lambda n: n >= 1, seconds=60)


async def _abort_what_waits_for_a_person(
    pool: asyncpg.Pool, settings: Settings, deployment: Deployment, orders: list[str]
) -> None:
    """A valid fuzzed start may have stopped at an approval gate: a person says no."""
    gated = await pool.fetch(
        "SELECT saga_id, order_id FROM sagas WHERE order_id = ANY($1)"
        " AND status = 'awaiting_approval'",
        orders,
    )
    if not gated:
        return
    async with Bus(settings, user=deployment.user("ana")) as bus, SagaClient(bus) as ana:
        for row in gated:
            await ana.reject(row["saga_id"], order_id=row["order_id"], reason="fuzz: not wanted")


async def _refund_every_order(settings: Settings, agent: str, orders: list[str]) -> int:
    """A normal refund of every touched order completes, behind whatever the fuzz started."""
    async with Bus(settings, user=agent) as bus, SagaClient(bus, answer_within_s=60) as client:
        sagas = [await client.start("refund", order_id=o, params=REFUND) for o in orders]
        outcomes = await asyncio.gather(
            *(client.wait(s, seconds=240) for s in sagas), return_exceptions=True
        )
    return sum(
        1 for o in outcomes if not isinstance(o, BaseException) and o.type == "saga.completed"
    )
