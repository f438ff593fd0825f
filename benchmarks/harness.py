"""One benchmark run: the real stack as processes, in its own namespace and database (both
removed afterwards), every guarantee on (durable quorum queues, confirms, outbox, inbox,
fsync), loaded by ``benchmarks.load``. Counts come from Postgres's own statistics, read after
the processes stopped (a backend reports its counters when idle only every few seconds)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import tempfile
from collections import Counter
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from benchmarks.accounts import roles_run
from benchmarks.load import Mix, inject_faults, new_run_id, run_load
from benchmarks.profile import Profile, record
from saga_shared.config import Settings
from saga_shared.storage.migrations import drop_database, migrate
from saga_shared.storage.sql import Queries
from saga_shared.transport.bus import Bus

Q = Queries(Path(__file__).with_name("harness.sql"))
SETTLE_S = 3.0  # the processes connect and subscribe
PROFILE_S = 6.0


@dataclass(frozen=True)
class Plan:
    sagas: int
    concurrency: int
    coordinators: int = 1
    mix: Mix = "mixed"
    preload: int = 0  # finished sagas stored before the run
    profile: bool = False  # sample the coordinator and the adapters with py-spy meanwhile
    identity: Literal["shared", "roles"] = "shared"  # roles: every process on its own account
    # One process runs everything (`saga run all`) and hands requests and outcomes to its own
    # consumers (SAGA_HANDOFF=in-process, shared identity only): reported apart.
    embedded: bool = False


@dataclass
class Result:
    plan: Plan
    seconds: float
    latencies_ms: list[float]
    outcomes: dict[str, int]
    messages_per_saga: float
    transactions_per_saga: float
    cpu_ms_per_saga: dict[str, float]  # per process, and the broker's and database's
    notes: list[str] = field(default_factory=list)
    profiles: list[Profile] = field(default_factory=list)
    quorum_messages_per_saga: float = 0.0  # through quorum queues: commands, outcomes
    wal_bytes_per_saga: float = 0.0

    @property
    def rate(self) -> float:
        return self.plan.sagas / self.seconds

    def percentile(self, p: float) -> float:
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]

    def efficiency(self, ceiling_msgs_per_s: float | None) -> float | None:
        """Quorum messages moved per second, as a share of what the broker alone moves."""
        if not ceiling_msgs_per_s:
            return None
        return self.rate * self.quorum_messages_per_saga / ceiling_msgs_per_s

    @property
    def cpu_ms(self) -> float:
        return sum(self.cpu_ms_per_saga.values())


def total_outcomes(counts: Iterable[Mapping[str, int]]) -> dict[str, int]:
    return dict(sum((Counter(c) for c in counts), Counter()))


def pooled(results: Sequence[Result]) -> Result:
    """Rounds of one plan, measured apart (alternating with the peer's), as one result."""
    first, total = results[0], sum(r.plan.sagas for r in results)

    def mean(values: Iterable[float]) -> float:
        return sum(v * r.plan.sagas for v, r in zip(values, results, strict=True)) / total

    outcomes = total_outcomes(r.outcomes for r in results)
    cpu = {k: round(mean(r.cpu_ms_per_saga.get(k, 0.0) for r in results), 2)
           for k in first.cpu_ms_per_saga}  # fmt: skip
    return Result(
        plan=replace(first.plan, sagas=total), seconds=sum(r.seconds for r in results),
        latencies_ms=[ms for r in results for ms in r.latencies_ms], outcomes=outcomes,
        messages_per_saga=mean(r.messages_per_saga for r in results),
        transactions_per_saga=mean(r.transactions_per_saga for r in results),
        cpu_ms_per_saga=cpu, notes=[f"{len(results)} rounds pooled"],
        quorum_messages_per_saga=mean(r.quorum_messages_per_saga for r in results),
        wal_bytes_per_saga=mean(r.wal_bytes_per_saga for r in results),
    )  # fmt: skip


def cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:  # gone, or another user's
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pids_named(name: str) -> list[int]:
    """Processes whose command is ``name`` (the broker's and the database's, when local)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == name:
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


class CpuMeter:
    """CPU used by each stack process, and by the local broker and database if visible."""

    def __init__(self, procs: list[tuple[str, asyncio.subprocess.Process]]) -> None:
        self.groups = {name: [p.pid] for name, p in procs}
        self.groups["rabbitmq"] = pids_named("beam.smp")
        self.groups["postgres"] = pids_named("postgres")
        self.groups["load"] = [os.getpid()]
        self.start = self._read()

    def _read(self) -> dict[str, float]:
        return {name: sum(cpu_seconds(p) for p in pids) for name, pids in self.groups.items()}

    def used(self) -> dict[str, float]:
        now = self._read()
        return {name: now[name] - self.start[name] for name in now if self.groups[name]}


async def _start_processes(
    settings: Settings,
    coordinators: int,
    extra: dict[str, str] | None = None,
    embedded: bool = False,
) -> list[tuple[str, asyncio.subprocess.Process]]:
    env = {
        **os.environ,
        **(extra or {}),
        "SAGA_AMQP_URL": settings.amqp_url,
        "SAGA_DATABASE_URL": settings.database_url,
        "SAGA_NAMESPACE": settings.namespace,
        "SAGA_PARTITIONS": str(settings.partitions),
        "SAGA_IDENTITY": settings.identity,
        "SAGA_USER_PREFIX": settings.user_prefix,
        "SAGA_AGENTS": settings.agents,
        "SAGA_SECRETS_DIR": settings.secrets_dir,
        "SAGA_AGENT_RATE": str(settings.agent_rate),
        "SAGA_AGENT_BURST": str(settings.agent_burst),
        "SAGA_LOG_LEVEL": "WARNING",
    }
    # Each coordinator takes its share of the partitions and stands by for the others.
    groups = [(f"coordinator-{n}", {"SAGA_COORDINATOR_SHARE": f"{n}/{coordinators}"},
               ["coordinator"]) for n in range(coordinators)]  # fmt: skip
    groups.append(("adapters", {}, ["inventory", "erp", "payments", "email"]))
    if embedded:  # or everything in one process, with the in-process hand-off
        groups = [("embedded", {"SAGA_HANDOFF": "in-process"}, ["all"])]
    procs = []
    for name, own, components in groups:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "saga_app.cli", "run", *components, env=env | own,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        procs.append((name, proc))
    return procs


async def _stop(procs: list[tuple[str, asyncio.subprocess.Process]]) -> None:
    for _, proc in procs:
        if proc.returncode is None:
            proc.terminate()
    for _, proc in procs:
        await proc.wait()


async def _profile(procs: list[tuple[str, asyncio.subprocess.Process]]) -> list[Profile]:
    """A few seconds of samples from the middle of the load (the run must last longer)."""
    await asyncio.sleep(2.0)
    pids = {name: p.pid for name, p in procs if name in ("coordinator-0", "adapters")}
    with tempfile.TemporaryDirectory() as scratch:
        return await record(pids, PROFILE_S, Path(scratch))


async def _counters(database_url: str) -> dict[str, int]:
    conn = await asyncpg.connect(database_url)
    try:
        row = await conn.fetchrow(Q.counters)
        assert row is not None
        return {key: int(value) for key, value in row.items()}
    finally:
        await conn.close()


def settings_for_run(base: Settings, run: str) -> Settings:
    parts = urlsplit(base.database_url)
    # In shared identity, one broker account for the whole run: the machine's guest user.
    return base.with_(
        namespace=f"bench-{run}",
        database_url=urlunsplit(parts._replace(path=f"/saga_bench_{run}")),
        identity="shared",
    )


RUN_DEPTH = 8  # a run holds at least this many sagas per one in flight


def sagas_for(sagas: int, concurrency: int) -> int:
    """Sagas of one run: at least ``RUN_DEPTH`` per saga in flight, so that the ramp up and
    the tail (fewer in flight than asked) stay a small part of it."""
    return max(sagas, RUN_DEPTH * concurrency)


async def run_benchmark(base: Settings, plan: Plan) -> Result:
    """One measurement in a fresh namespace and database."""
    async with _fresh(base, plan.identity) as settings:
        return await _measure(settings, plan, [])


async def run_growth(
    base: Settings, sagas: int, concurrencies: list[int], stored: int, rounds: int = 2
) -> list[tuple[Result, Result]]:
    """Two databases and namespaces, one empty and one holding ``stored`` finished sagas,
    measured in alternating rounds and pooled: a slower minute on the machine, or the preload's
    pages still being written out, then hits both sides alike. (One run of each, back to back,
    once showed a 22.5% loss that every process shared, the load generator's included.)"""
    from benchmarks.preload import preload  # only the growth run needs it

    async with _fresh(base) as empty, _fresh(base) as full:
        filled = await preload(full.database_url, stored)
        size = filled.database_bytes / 2**30
        note = (f"{filled.sagas:,} finished sagas stored in the second database: "
                f"{size:.1f} GiB, filled in {filled.seconds:.0f} s")  # fmt: skip
        runs: dict[tuple[int, bool], list[Result]] = {}
        for _ in range(rounds):
            for c in concurrencies:
                for settings, is_full in ((empty, False), (full, True)):
                    plan = Plan(sagas_for(sagas, c), c, preload=stored if is_full else 0)
                    runs.setdefault((c, is_full), []).append(await _measure(settings, plan, []))
    pairs = [(pooled(runs[c, False]), pooled(runs[c, True])) for c in concurrencies]
    for _, grown in pairs:
        grown.notes.append(note)
    return pairs


@contextlib.asynccontextmanager
async def _fresh(
    base: Settings, identity: Literal["shared", "roles"] = "shared"
) -> AsyncIterator[Settings]:
    """A run's own namespace and database; in ``roles`` identity, its own vhost and accounts
    too (``benchmarks.accounts``)."""
    settings = settings_for_run(base, new_run_id())
    if identity == "roles":
        async with roles_run(settings) as roles:
            yield roles
        return
    await migrate(settings.database_url)
    try:
        async with Bus(settings) as bus:
            await bus.declare()
        yield settings
    finally:
        async with Bus(settings) as bus:
            channel = await bus.connection.channel()
            await bus.topology.delete(channel)
        await drop_database(settings.database_url)


async def _measure(settings: Settings, plan: Plan, notes: list[str]) -> Result:
    run = new_run_id()  # the sagas' ids: each measurement its own
    await inject_faults(settings.database_url, run, plan.sagas, plan.mix)
    procs = await _start_processes(settings, plan.coordinators, embedded=plan.embedded)
    try:
        await asyncio.sleep(SETTLE_S)
        await run_load(settings, f"w{run}", min(4, plan.sagas), min(4, plan.concurrency), "mixed")
        await asyncio.sleep(1.0)
        before = await _counters(settings.database_url)
        meter = CpuMeter(procs)
        sampling = asyncio.create_task(_profile(procs)) if plan.profile else None
        load = await run_load(settings, run, plan.sagas, plan.concurrency, plan.mix)
        cpu = meter.used()
        profiles = await sampling if sampling is not None else []
    finally:
        await _stop(procs)
    await asyncio.sleep(1.0)  # the stopped backends' last counters reach the statistics
    after = await _counters(settings.database_url)
    delta = {key: after[key] - before[key] for key in after}
    # The agent's command (routed straight to its partition), what the coordinator published
    # (requests, replies, events) and the adapters' outcomes; a request per outcome. Requests
    # and outcomes travel through classic queues: the command, settles' answers and deadlines
    # through quorum.
    messages = plan.sagas + delta["outbox_rows"] + delta["outcomes"]
    quorum = plan.sagas + delta["quorum_replies"]
    return Result(
        plan=plan, seconds=load.seconds, latencies_ms=load.latencies_ms, outcomes=load.outcomes,
        messages_per_saga=messages / plan.sagas,
        transactions_per_saga=delta["transactions"] / plan.sagas,
        cpu_ms_per_saga={k: round(v / plan.sagas * 1000, 2) for k, v in cpu.items()},
        notes=notes, profiles=profiles, quorum_messages_per_saga=quorum / plan.sagas,
        wal_bytes_per_saga=delta["wal_bytes"] / plan.sagas,
    )  # fmt: skip
