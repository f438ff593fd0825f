"""The same stack on a three-node RabbitMQ cluster and on a Postgres primary with a synchronous
standby: a broker node dies, or the database fails over, under a steady load of sagas. Nothing
is lost, nothing applied twice, and the time to recover is measured (printed: `pytest -s`). The
quorum queues' leaders are spread over the nodes at the start, and again once the nodes that
died are back and the rebalance docs/how-to/cluster.md prescribes has run."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator

import asyncpg
import pytest

from saga_app.stack import Stack
from saga_shared.client import SagaClient
from saga_shared.config import Settings
from saga_shared.model.messages import StartSaga
from saga_shared.storage.migrations import migrate
from saga_shared.transport.bus import Bus
from tests.chaos.cluster import RabbitCluster, ReplicatedPostgres
from tests.chaos.instances import DisposablePostgres, DisposableRabbit
from tests.integration.helpers import REFUND

pytestmark = pytest.mark.timeout(600)
TERMINAL = ("completed", "compensated", "needs_human", "resolved")
STORY_TABLES = ("sagas", "saga_log", "deadlines", "dead_letters", "outbox", "parked",
                "order_blocks", "orders")  # fmt: skip


def say(text: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {text}", flush=True)


class SteadyLoad:
    """Refunds at a steady rate until stopped, each start re-sent under its own message id until
    the broker confirms it (a node that dies takes unconfirmed publishes with it). It runs until
    the test has seen the recovery it waits for: a load of fixed size could end before a slow
    ``rabbitmqctl`` let the kill happen, and no saga would ever start after it."""

    def __init__(self, bus: Bus, per_second: float = 8.0) -> None:
        self.bus = bus
        self.interval = 1.0 / per_second
        self.started: dict[str, float] = {}  # saga_id -> when its start was confirmed
        self.resent = 0
        self._progress = asyncio.Condition()
        self._stopping = asyncio.Event()

    async def reached(self, count: int) -> None:
        async with self._progress:
            await self._progress.wait_for(lambda: len(self.started) >= count)

    def stop(self) -> None:
        self._stopping.set()

    async def run(self) -> None:
        n = 0
        while not self._stopping.is_set():
            n += 1
            saga_id = f"c-{n:04d}-{time.monotonic_ns() % 10**6}"
            command = StartSaga(message_id=f"m-{saga_id}", saga_id=saga_id, order_id=f"o-{saga_id}",
                                saga="refund", params=REFUND)  # fmt: skip
            key = self.bus.topology.command_key(command.type, command.order_id)
            while True:
                try:
                    await self.bus.publish(self.bus.topology.commands_exchange, key, command)
                    break
                except Exception:  # the connection is moving to another node
                    self.resent += 1
                    await asyncio.sleep(0.2)
            self.started[saga_id] = time.monotonic()
            async with self._progress:
                self._progress.notify_all()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self.interval)


async def statuses(pool: asyncpg.Pool, ids: list[str]) -> dict[str, str]:
    rows = await pool.fetch("SELECT saga_id, status FROM sagas WHERE saga_id = ANY($1)", ids)
    return {r["saga_id"]: r["status"] for r in rows}


async def all_terminal(pool: asyncpg.Pool, ids: list[str], limit_s: float = 180) -> dict[str, str]:
    deadline = time.monotonic() + limit_s
    while True:
        found = await statuses(pool, ids)
        if len(found) == len(ids) and all(s in TERMINAL for s in found.values()):
            return found
        if time.monotonic() > deadline:
            missing = [i for i in ids if found.get(i) not in TERMINAL]
            stories = [await story(pool, saga_id) for saga_id in missing[:3]]
            raise AssertionError(f"{len(missing)} sagas not finished:\n" + "\n".join(stories))
        await asyncio.sleep(0.2)


async def story(pool: asyncpg.Pool, saga_id: str) -> str:
    """What the database knows of one saga: enough to tell where a message went missing."""
    parts = [f"saga {saga_id}:"]
    for table in STORY_TABLES:
        column = (
            "saga_id" if table in ("sagas", "saga_log", "deadlines", "dead_letters") else "order_id"
        )
        key = saga_id if column == "saga_id" else f"o-{saga_id}"
        rows = await pool.fetch(f"SELECT * FROM {table} WHERE {column} = $1", key)
        parts += [f"  {table}: {dict(r)}" for r in rows]
    return "\n".join(parts)


async def effects_applied_twice(pool: asyncpg.Pool) -> list[str]:
    rows = await pool.fetch(
        "SELECT idempotency_key FROM sim_effects GROUP BY idempotency_key HAVING count(*) > 1"
    )
    return [r[0] for r in rows]


async def recovery_s(
    load: SteadyLoad, pool: asyncpg.Pool, since: float, limit_s: float = 180
) -> float:
    """Seconds from ``since`` until a saga started after it has completed."""
    while True:
        later = [s for s, t in load.started.items() if t > since]
        done = await statuses(pool, later) if later else {}
        if any(v == "completed" for v in done.values()):
            return time.monotonic() - since
        if time.monotonic() - since > limit_s:
            raise AssertionError(
                f"no saga started after the kill completed within {limit_s:g}s: "
                f"{len(later)} started since, {len(load.started)} in all"
            )
        await asyncio.sleep(0.1)


@contextlib.asynccontextmanager
async def running(settings: Settings) -> AsyncIterator[tuple[Stack, Bus, asyncpg.Pool]]:
    await migrate(settings.database_url)
    async with Stack(settings) as stack, Bus(settings) as bus:
        pool = await asyncpg.create_pool(settings.database_url, min_size=1, max_size=4)
        try:
            yield stack, bus, pool
        finally:
            await pool.close()


async def started_six_times(bus: Bus) -> str:
    """A start sent three times under one message id and three under new ones, by the agents'
    client, while a node is down: every send is answered, and it starts once."""
    saga_id = f"c-repeated-{time.monotonic_ns() % 10**6}"
    async with SagaClient(bus, answer_within_s=60) as client:
        for message_id in ("r-1", "r-1", "r-1", "r-2", "r-3", "r-4"):
            await client.start("refund", order_id=f"o-{saga_id}", saga_id=saga_id,
                               params=REFUND, message_id=f"{saga_id}-{message_id}")  # fmt: skip
            reply = client.last_reply
            assert reply is not None and reply.type == "command.accepted", reply
    return saga_id


async def leaders_spread(rabbit: RabbitCluster, bus: Bus, limit_s: float = 60) -> dict[str, int]:
    """How many of the namespace's quorum queues each node leads, once every queue has a leader,
    every node leads at least one and none more than half of them (rounded up): what the
    ``balanced`` leader locator gives at declaration, and ``rabbitmq-queues rebalance quorum``
    after a node returns (a leader moves after the command has returned)."""
    queues = bus.topology.quorum_queues()  # a request queue is classic: no leader
    most = math.ceil(len(queues) / 2)
    deadline = time.monotonic() + limit_s
    while True:
        led = await rabbit.leaders_per_node(f"{bus.topology.namespace}.")
        if sum(led.values()) == len(queues) and 1 <= min(led.values()) <= max(led.values()) <= most:
            return led
        if time.monotonic() > deadline:
            raise AssertionError(f"{len(queues)} quorum queues' leaders not spread: {led}")
        await asyncio.sleep(0.5)


def spread(led: dict[str, int]) -> str:
    return "/".join(str(n) for n in led.values())


async def rebalance_as_documented(rabbit: RabbitCluster, bus: Bus) -> str:
    """With every node back (those that died leading few queues or none: RabbitMQ 3.10 leaves
    each leader where it moved), what docs/how-to/cluster.md has the operator run; the leaders
    spread again, the returned nodes leading some."""
    before = spread(await rabbit.leaders_per_node(f"{bus.topology.namespace}."))
    say(f"leaders per node with every node back: {before}; rabbitmq-queues rebalance quorum")
    await rabbit.rebalance()
    after = spread(await leaders_spread(rabbit, bus))
    say(f"leaders per node once rebalanced: {after}")
    return after


def cluster_settings(amqp_url: str, database_url: str) -> Settings:
    return Settings(amqp_url=amqp_url, database_url=database_url, namespace="cl", partitions=4,
                    quorum_size=3, watchdog_s=0.3, relay_poll_s=0.2, identity="shared")  # fmt: skip


async def test_broker_nodes_die_under_load_and_no_saga_is_lost_or_applied_twice() -> None:
    async with RabbitCluster() as rabbit, DisposablePostgres() as pg:
        settings = cluster_settings(rabbit.url(), pg.url("saga"))
        async with running(settings) as (_, bus, pool):
            at_start = spread(await leaders_spread(rabbit, bus))
            say(f"quorum-queue leaders per node at start: {at_start}")
            load = SteadyLoad(bus)
            sending = asyncio.create_task(load.run())
            await load.reached(20)
            first = await rabbit.busiest_leader("cl.partition.")
            killed_at = time.monotonic()
            say(f"SIGKILL {first.name}, leader of most partitions")
            await first.crash()
            first_recovery = await recovery_s(load, pool, killed_at)
            say(f"sagas complete again after {first_recovery:.1f}s")
            repeated = await started_six_times(bus)  # with a node still down
            await load.reached(60)
            second = next(n for n in rabbit.nodes if n is not first)
            say(f"SIGKILL {second.name} too: no majority")
            await second.crash()  # two of three down: no majority, so no queue can go on
            await asyncio.sleep(3)
            await first.start()  # a majority again
            killed_at = time.monotonic()
            say(f"{first.name} back")
            second_recovery = await recovery_s(load, pool, killed_at)
            say(f"sagas complete again after {second_recovery:.1f}s")
            await second.start()
            say(f"{second.name} back")
            rebalanced = await rebalance_as_documented(rabbit, bus)
            await load.reached(len(load.started) + 10)  # some sagas on the whole cluster again
            load.stop()
            await sending
            ids = [*load.started, repeated]
            found = await all_terminal(pool, ids)
            assert set(found.values()) == {"completed"}
            assert await effects_applied_twice(pool) == []
            members = await rabbit.running_nodes()
            assert len(members) == 3
    print(
        f"\nbroker: {len(ids)} sagas, {load.resent} starts re-sent; back after the leader died "
        f"{first_recovery:.1f}s, after the majority returned {second_recovery:.1f}s; quorum-queue "
        f"leaders per node {at_start} at start, {rebalanced} once rebalanced"
    )


async def test_the_database_fails_over_under_load_and_nothing_acted_on_is_missing() -> None:
    async with DisposableRabbit() as rabbit, ReplicatedPostgres() as pg:
        settings = cluster_settings(rabbit.url(), pg.url("saga"))
        async with running(settings) as (_, bus, pool):
            load = SteadyLoad(bus)
            sending = asyncio.create_task(load.run())
            await load.reached(25)
            before = await statuses(pool, list(load.started))
            killed_at = time.monotonic()
            promote_s = await pg.fail_over()
            recovery = await recovery_s(load, pool, killed_at)
            await load.reached(len(load.started) + 10)
            load.stop()
            await sending
            ids = list(load.started)
            found = await all_terminal(pool, ids)
            assert set(found.values()) == {"completed"}
            # what was committed before the primary died is on the new primary, every row
            assert set(before) <= set(found)
            assert await effects_applied_twice(pool) == []
    print(
        f"\ndatabase: {len(ids)} sagas, promotion {promote_s:.1f}s, sagas completing again "
        f"{recovery:.1f}s after the primary died"
    )
