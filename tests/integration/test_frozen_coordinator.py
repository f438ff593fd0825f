"""A coordinator process frozen (SIGSTOP) while it owns partitions, against the real RabbitMQ and
Postgres: the other process takes its locks after the lease, and its queues once the broker
drops the silent connection (the heartbeat, half the lease), so the sagas of every partition
finish while it stays frozen; woken, it stops consuming what the other holds now
(docs/explanation/design.md, "Who owns a partition")."""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from pathlib import Path

import asyncpg

from saga_app.stack import Stack
from saga_shared.client import SagaClient
from saga_shared.config import Settings
from saga_shared.transport.bus import Bus
from saga_shared.transport.topology import partition_of
from tests.integration.helpers import REFUND, Processes, consumers_of, eventually, remove_namespace

ADAPTERS = ["inventory", "erp", "payments", "email"]


def orders_for(partitions: range) -> list[str]:
    """Two orders routed to each partition."""
    found: list[str] = []
    for p in partitions:
        while sum(partition_of(o, len(partitions)) == p for o in found) < 2:
            order = f"order-{uuid.uuid4().hex[:10]}"
            if partition_of(order, len(partitions)) == p:
                found.append(order)
    return found


async def run_sagas(agent: SagaClient, orders: list[str], seconds: float) -> list[str]:
    async def one(order: str) -> str:
        saga = await agent.start("refund", order_id=order, params=REFUND,
                                 answer_within_s=seconds)  # fmt: skip
        return (await agent.wait(saga, seconds=seconds)).type

    return await asyncio.gather(*(one(o) for o in orders))


async def locks_per_session(settings: Settings) -> list[int]:
    """How many partition locks each coordinator session holds, fewest first."""
    conn = await asyncpg.connect(settings.database_url)
    try:
        rows = await conn.fetch(
            "SELECT count(*) AS n FROM pg_locks WHERE locktype = 'advisory' AND granted"
            " AND objsubid = 2 AND classid = hashtext($1)::oid GROUP BY pid ORDER BY n",
            f"saga.partition:{settings.namespace}",
        )
    finally:
        await conn.close()
    return [int(r["n"]) for r in rows]


def stopped(pid: int) -> bool:
    """The process is stopped (SIGSTOP), as ``ps`` would show it: state ``T``."""
    return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("T")


async def test_a_frozen_coordinators_partitions_pass_to_the_other_and_come_back_to_one_owner(
    settings: Settings, tmp_path: Path
) -> None:
    # Each process takes its share first, the rest only 5 s into its session: were the second
    # to start that much later, the first would own every partition (checked: ``shared``).
    fast = settings.with_(partition_lease_s=3.0, standby_after_s=5.0)
    queues = [Bus(fast).topology.partition_queue(p) for p in range(fast.partitions)]
    (tmp_path / "first").mkdir()
    (tmp_path / "second").mkdir()
    first = Processes(fast.with_(coordinator_share="0/2"), tmp_path / "first")
    second = Processes(fast.with_(coordinator_share="1/2"), tmp_path / "second")
    adapters = Stack(fast, ADAPTERS)
    frozen: int | None = None
    try:
        await adapters.start()
        await first.start("coordinator")
        frozen = (await second.start("coordinator")).pid
        async with Bus(fast) as bus, SagaClient(bus) as agent:
            one_each = lambda n: all(c == 1 for c in n)  # noqa: E731
            await eventually(lambda: asyncio.gather(*(consumers_of(bus, q) for q in queues)),
                             one_each)  # fmt: skip
            shared = await locks_per_session(fast)  # the one to freeze owns half
            before = await run_sagas(agent, orders_for(range(fast.partitions)), 30)

            os.kill(frozen, signal.SIGSTOP)
            during = await run_sagas(agent, orders_for(range(fast.partitions)), 45)
            taken = await locks_per_session(fast)
            still_frozen = stopped(frozen)

            os.kill(frozen, signal.SIGCONT)
            await asyncio.sleep(3 * fast.watchdog_s + fast.lease_s)  # woken, it has looked
            held = await asyncio.gather(*(consumers_of(bus, q) for q in queues))
            after = await run_sagas(agent, orders_for(range(fast.partitions)), 30)
            # aio-pika reconnects the woken process 5 s after it finds its connection dropped
            # and restores the consumers it still knows of: none may come back.
            await asyncio.sleep(6)
            held_later = await asyncio.gather(*(consumers_of(bus, q) for q in queues))
    finally:
        if frozen is not None:
            os.kill(frozen, signal.SIGCONT)
        await second.stop_all()
        await first.stop_all()
        await adapters.stop()
        await remove_namespace(fast)

    assert shared == [2, 2]
    assert before == ["saga.completed"] * 8
    assert taken == [4]  # the frozen one's session was ended after the lease
    # Without the heartbeat the broker kept delivering to the frozen process for over 90 s.
    assert during == ["saga.completed"] * 8
    assert still_frozen
    # Woken, it found its session gone and let go: one consumer per partition queue.
    assert held == [1] * fast.partitions
    assert after == ["saga.completed"] * 8
    assert held_later == [1] * fast.partitions
