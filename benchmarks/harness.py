"""Sagas per second and latency of the real stack, every guarantee on (durable quorum queues,
confirms, outbox, inbox, fsync), against the local RabbitMQ and Postgres. The stack runs as
real processes in its own namespace and database, both removed afterwards."""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
from aio_pika.abc import AbstractIncomingMessage, ExchangeType
from pydantic import TypeAdapter

from benchmarks.ceiling import raw_broker_rate
from shared.bus import Bus
from shared.codec import decode
from shared.config import Settings
from shared.messages import SagaEvent, StartSaga
from shared.migrations import drop_database, migrate

_EVENT: TypeAdapter[SagaEvent] = TypeAdapter(SagaEvent)
FINAL = ("saga.completed", "saga.compensated", "saga.needs_human")
PARAMS = {"sku": "SKU-1", "quantity": 1, "amount_cents": 4999, "customer_email": "a@example.com",
          "card_token": "tok_1", "address": "1 Main Street"}  # fmt: skip


@dataclass
class Result:
    sagas: int
    concurrency: int
    seconds: float
    latencies_ms: list[float]
    outcomes: dict[str, int]
    messages_per_saga: float
    transactions_per_saga: float
    cpu_seconds: dict[str, float]
    ceiling_msgs_per_s: float | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.sagas / self.seconds

    def percentile(self, p: float) -> float:
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]

    @property
    def efficiency(self) -> float | None:
        if not self.ceiling_msgs_per_s:
            return None
        return self.rate * self.messages_per_saga / self.ceiling_msgs_per_s


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _start_processes(
    settings: Settings, coordinators: int
) -> list[tuple[str, asyncio.subprocess.Process]]:
    env = {
        **os.environ,
        "SAGA_AMQP_URL": settings.amqp_url,
        "SAGA_DATABASE_URL": settings.database_url,
        "SAGA_NAMESPACE": settings.namespace,
        "SAGA_PARTITIONS": str(settings.partitions),
        "SAGA_LOG_LEVEL": "WARNING",
    }
    groups = [[f"coordinator-{n}", "coordinator"] for n in range(coordinators)]
    groups.append(["adapters", "inventory", "erp", "payments", "email"])
    procs = []
    for name, *components in groups:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "saga_coordinator.cli", "run", *components, env=env,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        procs.append((name, proc))
    return procs


async def _load(
    settings: Settings, sagas: int, concurrency: int, failing: float
) -> tuple[float, list[float], dict[str, int], int]:
    """Publish as agents would, ``concurrency`` sagas in flight; latency is from publish to the
    final lifecycle event."""
    async with Bus(settings) as bus:
        channel = await bus.connection.channel()
        exchange = await channel.declare_exchange(
            bus.topology.events_exchange, ExchangeType.TOPIC, durable=True
        )
        queue = await channel.declare_queue(exclusive=True, auto_delete=True)
        await queue.bind(exchange, routing_key="#")
        waiting: dict[str, asyncio.Future[str]] = {}
        events = 0

        async def on_event(message: AbstractIncomingMessage) -> None:
            nonlocal events
            events += 1
            event = decode(message.body, _EVENT, max_bytes=settings.max_message_bytes)
            future = waiting.get(event.saga_id)
            if event.type in FINAL and future is not None and not future.done():
                future.set_result(event.type)

        await queue.consume(on_event, no_ack=True)
        window = asyncio.Semaphore(concurrency)
        latencies: list[float] = []
        outcomes: dict[str, int] = {}
        run = uuid.uuid4().hex[:6]

        async def one(i: int) -> None:
            async with window:
                saga = "refund" if i % 2 else "checkout"
                params = dict(PARAMS)
                if i % 10 == 0:  # one in ten fails at the address check and compensates
                    saga, params["address"] = "checkout", "Closed depot"
                if saga == "refund":
                    params = {k: v for k, v in params.items() if k not in ("card_token", "address")}
                command = StartSaga(
                    saga_id=f"b{run}-{i}", order_id=f"bo{run}-{i}", saga=saga, params=params
                )
                waiting[command.saga_id] = asyncio.get_running_loop().create_future()
                began = time.perf_counter()
                await bus.publish(bus.topology.commands_exchange, command.type, command)
                outcome = await asyncio.wait_for(waiting[command.saga_id], 120)
                latencies.append((time.perf_counter() - began) * 1000)
                outcomes[outcome] = outcomes.get(outcome, 0) + 1

        started = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(sagas)))
        elapsed = time.perf_counter() - started
        await channel.close()
        return elapsed, latencies, outcomes, events


async def run_benchmark(base: Settings, sagas: int, concurrency: int, coordinators: int = 1,
                        ceiling_messages: int = 0) -> Result:  # fmt: skip
    run = uuid.uuid4().hex[:8]
    parts = urlsplit(base.database_url)
    settings = base.with_(
        namespace=f"bench-{run}", database_url=urlunsplit(parts._replace(path=f"/saga_bench_{run}"))
    )
    ceiling = (
        await raw_broker_rate(settings.amqp_url, ceiling_messages) if ceiling_messages else None
    )
    await migrate(settings.database_url)
    async with Bus(settings) as bus:
        await bus.declare()
    procs = await _start_processes(settings, coordinators)
    try:
        await asyncio.sleep(3)  # the processes connect and subscribe
        await _load(settings, min(4, sagas), min(4, concurrency), 0.1)  # warm-up
        conn = await asyncpg.connect(settings.database_url)
        tx_before = await conn.fetchval(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        )
        handled_before = await conn.fetchval("SELECT count(*) FROM saga_log")
        cpu_before = {name: _cpu_seconds(p.pid) for name, p in procs}
        elapsed, latencies, outcomes, events = await _load(settings, sagas, concurrency, 0.1)
        cpu = {name: round(_cpu_seconds(p.pid) - cpu_before[name], 2) for name, p in procs}
        await asyncio.sleep(0.6)  # pg_stat counters are flushed every 500 ms
        tx_after = await conn.fetchval(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        )
        handled = await conn.fetchval("SELECT count(*) FROM saga_log") - handled_before
        await conn.close()
    finally:
        for _, proc in procs:
            proc.terminate()
        for _, proc in procs:
            await proc.wait()
        async with Bus(settings) as bus:
            channel = await bus.connection.channel()
            await bus.topology.delete(channel)
        await drop_database(settings.database_url)
    # each saga: its command through the intake, every message the coordinator handled, one
    # request per outcome (outcomes are among the handled), and the public events
    outcomes_total = sum(outcomes.values())
    messages = (2 * outcomes_total + handled + events - outcomes_total) / sagas
    return Result(
        sagas=sagas, concurrency=concurrency, seconds=elapsed, latencies_ms=latencies,
        outcomes=outcomes, messages_per_saga=messages,
        transactions_per_saga=(tx_after - tx_before) / sagas,
        cpu_seconds={k: round(v / sagas * 1000, 2) for k, v in cpu.items()},
        ceiling_msgs_per_s=ceiling,
    )  # fmt: skip


def report(results: list[Result]) -> str:
    lines = [
        "# Benchmark report",
        "",
        "Every guarantee on: durable quorum queues, publisher confirms, outbox, inbox, fsync.",
        "Mix: refunds and checkouts, one in ten compensated. CPU is milliseconds per saga.",
        "",
        "| sagas | concurrency | sagas/s | p50 ms | p95 ms | p99 ms | msgs/saga | tx/saga "
        "| efficiency | CPU ms/saga |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for r in results:
        eff = f"{r.efficiency:.2f}" if r.efficiency is not None else "-"
        cpu = ", ".join(f"{k} {v}" for k, v in r.cpu_seconds.items())
        lines.append(
            f"| {r.sagas} | {r.concurrency} | {r.rate:.1f} | {r.percentile(50):.1f} | "
            f"{r.percentile(95):.1f} | {r.percentile(99):.1f} | {r.messages_per_saga:.1f} | "
            f"{r.transactions_per_saga:.1f} | {eff} | {cpu} |"
        )
    ceilings = [r.ceiling_msgs_per_s for r in results if r.ceiling_msgs_per_s]
    if ceilings:
        lines += [
            "",
            f"Raw broker ceiling in the same run: {ceilings[0]:.0f} msgs/s (one process).",
        ]
    return "\n".join(lines) + "\n"


def summary_line(r: Result) -> str:
    return (f"{r.sagas} sagas at concurrency {r.concurrency}: {r.rate:.1f} sagas/s, "
            f"p50 {r.percentile(50):.1f} ms, p99 {r.percentile(99):.1f} ms, outcomes {r.outcomes}, "
            f"{statistics.mean(r.latencies_ms):.1f} ms mean")  # fmt: skip
