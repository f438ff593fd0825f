"""Commands accepted per second: starts of a saga whose one step waits at an approval gate,
each for its own order, published as fast as the broker confirms them (in pipelined batches,
straight to their partitions, no ``reply_to``), timed from the first publish until every saga
is in the register and its ``saga.awaiting_approval`` event has been published (counted in a
queue of the benchmark's own): a command is accepted once it is announced, and a coordinator
that registered commands faster than it published their events would only defer the work.
No adapter has work, so this is the gateway, the convoy, the register write and the events.
The agents' rate limit is lifted for the measurement."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass

import aiormq.abc
import asyncpg
from pydantic import JsonValue

from benchmarks.harness import SETTLE_S, _fresh, _start_processes, _stop
from benchmarks.load import new_run_id
from saga_shared.config import Settings
from saga_shared.model.messages import Gate, Plan, PlanStep, StartSaga
from saga_shared.transport.bus import Bus
from saga_shared.transport.codec import message_to_amqp

GATED = Plan(steps=(PlanStep(action="inventory.reserve_stock", gate=Gate()),))
CHUNK = 500  # publishes in one confirm round


@dataclass(frozen=True)
class Accepted:
    commands: int
    coordinators: int  # processes sharing the partitions
    publish_seconds: float  # until the broker confirmed the last
    registered_seconds: float  # until the last saga was in the register
    seconds: float  # until the last saga's event was published too
    rounds: tuple[float, ...] = ()  # each round's rate, when rounds were pooled

    @property
    def rate(self) -> float:
        return self.commands / self.seconds


def pooled(runs: Sequence[Accepted]) -> Accepted:
    """Rounds of one coordinator count, measured apart, as one: commands and seconds summed (a
    round of two seconds on a machine whose load comes and goes is one sample, not a figure)."""
    return Accepted(
        sum(r.commands for r in runs), runs[0].coordinators,
        sum(r.publish_seconds for r in runs), sum(r.registered_seconds for r in runs),
        sum(r.seconds for r in runs), tuple(r.rate for r in runs),
    )  # fmt: skip


async def commands_accepted(base: Settings, commands: int, coordinators: int = 1) -> Accepted:
    unlimited = {"SAGA_AGENT_RATE": "1000000", "SAGA_AGENT_BURST": "1000000"}
    run = new_run_id()
    async with _fresh(base) as settings:
        procs = await _start_processes(settings, coordinators, unlimited)
        try:
            await asyncio.sleep(SETTLE_S)
            return Accepted(
                commands, coordinators, *await _publish_and_wait(settings, run, commands)
            )
        finally:
            await _stop(procs)


async def _publish_and_wait(
    settings: Settings, run: str, commands: int
) -> tuple[float, float, float]:
    """Seconds until the broker confirmed the last command, until the last was in the register,
    and until the last event was published."""
    params: dict[str, JsonValue] = {"sku": "SKU-1", "quantity": 1}
    starts = [
        StartSaga(saga_id=f"c{run}-{i}", order_id=f"co{run}-{i}", plan=GATED, params=params)
        for i in range(commands)
    ]
    conn = await asyncpg.connect(settings.database_url)
    try:
        async with Bus(settings) as bus:
            t = bus.topology
            channel = await bus.connection.channel()
            announced = await channel.declare_queue(exclusive=True)
            await announced.bind(t.events_exchange, "saga.awaiting_approval")
            underlay = await channel.get_underlay_channel()
            items = [(t.commands_exchange, t.command_key(s.type, s.order_id), message_to_amqp(s))
                     for s in starts]  # fmt: skip
            began = time.perf_counter()
            for i in range(0, len(items), CHUNK):
                errors = await bus.publish_many(items[i : i + CHUNK])
                if any(errors):
                    raise RuntimeError(f"publishing commands failed: {errors}")
            published = time.perf_counter() - began
            await _until_registered(conn, commands)
            registered = time.perf_counter() - began
            await _until_announced(underlay, announced.name, commands)
            return published, registered, time.perf_counter() - began
    finally:
        await conn.close()


async def _until_announced(channel: aiormq.abc.AbstractChannel, queue: str, commands: int) -> None:
    """Polls the queue's count: the events stay in it, unread."""
    while True:
        if ((await channel.queue_declare(queue, passive=True)).message_count or 0) >= commands:
            return
        await asyncio.sleep(0.02)


async def _until_registered(conn: asyncpg.Connection, commands: int) -> None:
    """Polls: the sagas are written by another process, which tells this one nothing."""
    while True:
        if await conn.fetchval("SELECT count(*) FROM sagas") >= commands:
            return
        await asyncio.sleep(0.02)
