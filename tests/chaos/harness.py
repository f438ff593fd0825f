"""The chaos run: the whole system as real processes on a disposable broker and database, a load
of sagas with injected faults, and random SIGKILLs and restarts of everything while it runs.
Then every rule of the design (docs/explanation/design.md) is checked for every saga
(``tests.chaos.checks``).

    result = await run_chaos(ChaosConfig(sagas=1000))      # from a test
    python -m tests.chaos --sagas 10000 --seed 7            # by hand (see __main__)
    python -m tests.chaos --reverify RUN_DIR                # the checks again, on a kept run

The run directory (printed) keeps every process log (logs/), the servers' logs (servers/), the
load and faults injected (load.json), every violation (violations.txt), the summary and a dump
of the final database (saga.dump), to investigate a failure afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import asyncpg

from saga_services.faults import clear_faults
from saga_shared.config import Settings
from saga_shared.model.messages import ResumeSaga
from saga_shared.storage.migrations import migrate
from saga_shared.transport.bus import Bus
from tests.chaos.checks import Observed, Verdict, observe, verify
from tests.chaos.cluster import RabbitCluster, ReplicatedPostgres
from tests.chaos.instances import DisposablePostgres, DisposableRabbit
from tests.chaos.load import (
    Load,
    LoadShape,
    Publisher,
    PublishStats,
    inject_faults,
    plan_load,
    saga_plans,
)
from tests.chaos.monkey import MIN_UPTIME_BEFORE_BROKER_CRASH_S, Monkey, Say, chaos_catalog
from tests.chaos.processes import COMPONENTS, EMBEDDED, ProcessExit, Supervisor
from tests.chaos.summary import summarize, violation_lines

Disruption = Callable[["ChaosSystem", Say], Coroutine[Any, Any, None]]
NAMESPACE = "chaos"
# Once every saga is final, wait this long before looking: a late duplicate still in flight
# would land an effect the checks must see.
QUIET_S = 5.0


def _say(text: str) -> None:
    print(text, flush=True)


@dataclass(frozen=True)
class ChaosConfig:
    sagas: int = 1000
    seed: int | None = None
    rate: float = 25.0  # sagas published per second: the load lasts sagas / rate seconds
    kill_every_s: float | None = 3.0  # mean time between SIGKILLs; None: no kills
    kill_pause_s: float = 2.0  # a killed process is restarted after 0..this many seconds
    broker_restarts: int = 1
    db_restarts: int = 1
    # An adapter frozen (SIGSTOP) once, at least this long and always longer than the longest
    # answer window of its actions and compensations (payments': 54 s), so the coordinator's
    # deadlines fire and resend while the frozen process holds its deliveries.
    freeze_s: float = 40.0
    # A coordinator frozen once this long (0: none): the other must take its partitions on.
    freeze_coordinator_s: float = 0.0
    # A restarted server stays down between half this and this many seconds.
    broker_down_s: float = 3.0
    db_down_s: float = 3.0
    chaos_tail_s: float = 10.0  # the chaos goes on this long after the last start is confirmed
    settle_timeout_s: float = 300.0
    with_faults: bool = True
    # Sagas per order, drawn uniformly: orders running 2-3 sagas in a row exercise the convoy.
    per_order: tuple[int, ...] = LoadShape.per_order
    workdir: Path | None = None
    cluster: bool = False  # three broker nodes, and a primary with a standby
    # Two `saga run all` processes, each handing requests and outcomes to its own consumers
    # (SAGA_HANDOFF=in-process), instead of a process per coordinator and adapter.
    embedded: bool = False
    # A scripted outage run beside the load (the outage tests): started with the load.
    disruption: Disruption | None = None


@dataclass
class ChaosResult:
    config: ChaosConfig
    seed: int
    workdir: Path
    verdict: Verdict
    publish: PublishStats
    kills: Counter[str]
    freezes: Counter[str]
    frozen_s: dict[str, float]  # how long each frozen process hung
    broker_restarts: int
    db_restarts: int
    process_exits: list[ProcessExit]
    graceful_stop: dict[str, bool]
    settled: bool
    duration_s: float
    orders: int
    summary: str = ""
    promote_s: float | None = None  # a cluster run's fail-over

    @property
    def ok(self) -> bool:
        confirmed = self.publish.confirmed == self.config.sagas
        return confirmed and self.settled and self.verdict.ok

    @property
    def sagas_per_s(self) -> float:
        return self.config.sagas / self.duration_s if self.duration_s > 0 else 0.0


# --- the system under test -----------------------------------------------------------------------


class ChaosSystem:
    """Disposable Postgres and RabbitMQ, migrated and declared, with every component running as
    its own OS process. Everything is stopped and removed on exit, the logs kept in ``workdir``."""

    def __init__(
        self, workdir: Path, say: Say = _say, partitions: int = 4, *, cluster: bool = False,
        embedded: bool = False,
    ) -> None:  # fmt: skip
        self.workdir = workdir
        # Two `saga run all` processes with the in-process hand-off, instead of one per part.
        self.embedded = embedded
        self.say = say
        self.partitions = partitions
        # A cluster: three RabbitMQ nodes (a broker crash kills the leader of most partitions)
        # and a primary with a synchronous standby (the first database crash is a fail-over).
        self.cluster = cluster
        self.pg: DisposablePostgres | ReplicatedPostgres = (
            ReplicatedPostgres() if cluster else DisposablePostgres()
        )
        self.rabbit: DisposableRabbit | RabbitCluster = (
            RabbitCluster() if cluster else DisposableRabbit()
        )
        if isinstance(self.rabbit, RabbitCluster):
            self.rabbit.namespace = NAMESPACE
        self._pool: asyncpg.Pool | None = None
        self._supervisor: Supervisor | None = None
        self.graceful_stop: dict[str, bool] = {}
        self.broker_up_since = 0.0

    @property
    def settings(self) -> Settings:
        return Settings(
            amqp_url=self.rabbit.url(),
            database_url=self.pg.url("saga"),
            namespace=NAMESPACE,
            partitions=self.partitions,
            identity="shared",  # crash safety is tested here; who may send what, elsewhere
            quorum_size=3 if self.cluster else 0,
        )

    @property
    def pool(self) -> asyncpg.Pool:
        assert self._pool is not None, "not started"
        return self._pool

    @property
    def supervisor(self) -> Supervisor:
        assert self._supervisor is not None, "not started"
        return self._supervisor

    def env(self) -> dict[str, str]:
        base = {k: v for k, v in os.environ.items() if not k.startswith("SAGA_")}
        return {
            **base,
            "SAGA_AMQP_URL": self.settings.amqp_url,
            "SAGA_DATABASE_URL": self.settings.database_url,
            "SAGA_NAMESPACE": NAMESPACE,
            "SAGA_PARTITIONS": str(self.partitions),
            "SAGA_IDENTITY": "shared",
            "SAGA_HANDOFF": "in-process" if self.embedded else "broker",
            "SAGA_QUORUM_SIZE": str(self.settings.quorum_size),
            "SAGA_LOG_LEVEL": "WARNING",
        }

    async def __aenter__(self) -> ChaosSystem:
        try:
            await self._start()
        except BaseException:
            await self._stop()
            raise
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._stop()

    async def _start(self) -> None:
        started = time.monotonic()
        await asyncio.gather(self.pg.start(), self.rabbit.start())
        self.broker_up_since = time.monotonic()
        await migrate(self.settings.database_url)
        async with Bus(self.settings) as bus:
            await bus.declare()  # so the agents can publish before any process is up
        # min_size 0: an idle pool does not log reconnect failures while the database is down.
        self._pool = await asyncpg.create_pool(self.settings.database_url, min_size=0, max_size=4)
        self._supervisor = Supervisor(self.env(), self.workdir / "logs", self.say,
                                      dict(EMBEDDED if self.embedded else COMPONENTS))  # fmt: skip
        await self.supervisor.start_all()
        self.say(
            f"system up in {time.monotonic() - started:.1f}s: postgres :{self.pg.port}, "
            f"rabbitmq {self.rabbit.name} :{self.rabbit.port}, processes "
            f"{', '.join(self.supervisor.components)}"
        )

    async def _stop(self) -> None:
        try:
            if self._supervisor is not None:
                self.graceful_stop = await self.supervisor.stop_all()
            if self._pool is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self._pool.close(), 10)
        finally:
            self.pg.archive_log(self.workdir / "servers")
            self.rabbit.archive_log(self.workdir / "servers")
            await asyncio.gather(self.rabbit.close(), self.pg.close(), return_exceptions=True)

    async def restart_broker(self, *, crash: bool, down_s: float) -> None:
        settle = MIN_UPTIME_BEFORE_BROKER_CRASH_S - (time.monotonic() - self.broker_up_since)
        if crash and settle > 0:
            await asyncio.sleep(settle)
        await (self.rabbit.crash() if crash else self.rabbit.stop())
        await asyncio.sleep(down_s)
        await self.rabbit.start()
        self.broker_up_since = time.monotonic()

    async def restart_database(self, *, crash: bool, down_s: float) -> None:
        await (self.pg.crash() if crash else self.pg.stop())
        await asyncio.sleep(down_s)
        await self.pg.start()

    async def settle(self, total: int, timeout_s: float, progress: Callable[[str], None]) -> bool:
        """Wait until every saga is final (or waits behind a needs_human saga, which rule 6
        says must keep its order) and the outbox is drained; False on timeout."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                row = await self.pool.fetchrow(_SETTLED_SQL)
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                progress(f"database not answering ({type(exc).__name__})")
                await asyncio.sleep(2)
                continue
            assert row is not None
            done = int(row["final"]) + int(row["held"])
            progress(f"final {done}/{total}, outbox {row['outbox']}, blocked {row['blocked']}")
            if done >= total and row["outbox"] == 0:
                await asyncio.sleep(QUIET_S)
                return True
            await asyncio.sleep(3)
        return False


_SETTLED_SQL = """
SELECT
  (SELECT count(*) FROM sagas WHERE status IN ('completed', 'compensated', 'needs_human'))
    AS final,
  (SELECT count(*) FROM sagas s JOIN orders o USING (order_id)
     JOIN sagas h ON h.saga_id = o.active_saga_id
   WHERE s.status = 'waiting' AND h.status = 'needs_human') AS held,
  (SELECT count(*) FROM outbox) AS outbox,
  (SELECT count(*) FROM order_blocks) AS blocked
"""


# --- the chaos monkey ----------------------------------------------------------------------------


# --- the run -------------------------------------------------------------------------------------


async def run_chaos(config: ChaosConfig, say: Say = _say) -> ChaosResult:
    seed = config.seed if config.seed is not None else random.randrange(2**32)
    rng = random.Random(seed)
    workdir = config.workdir or Path(tempfile.mkdtemp(prefix="saga-chaos-run-"))
    workdir.mkdir(parents=True, exist_ok=True)
    say(f"chaos run: {config.sagas} sagas, seed {seed}, run directory {workdir}")
    load = build_load(config, rng)
    (workdir / "load.json").write_text(json.dumps(load.describe(), indent=1))
    with _library_logs_to(workdir / "harness.log"):
        async with ChaosSystem(
            workdir, say, cluster=config.cluster, embedded=config.embedded
        ) as system:
            result = await _drive(system, load, config, seed, rng, say)
    result.graceful_stop = system.graceful_stop
    result.summary = summarize(result)
    (workdir / "summary.txt").write_text(result.summary + "\n")
    (workdir / "violations.txt").write_text("\n".join(map(str, result.verdict.violations)) + "\n")
    say(result.summary)
    return result


@contextlib.contextmanager
def _library_logs_to(path: Path) -> Iterator[None]:
    """aio-pika and asyncpg log every reconnect attempt of the harness's own connections: into
    the run directory with them, not onto the summary."""
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)
        handler.close()


def build_load(config: ChaosConfig, rng: random.Random) -> Load:
    plans = saga_plans(chaos_catalog())
    shape = LoadShape(
        sagas=config.sagas, with_faults=config.with_faults, per_order=config.per_order
    )
    return plan_load(shape, plans, rng)


async def _drive(
    system: ChaosSystem, load: Load, config: ChaosConfig, seed: int, rng: random.Random, say: Say
) -> ChaosResult:
    await inject_faults(system.pool, load)
    say(f"injected {len(load.faults)} faults over {len(load.orders)} orders")
    monkey = Monkey(system, config, rng, say)
    publisher = Publisher(system.settings, load, config.rate, say)
    window = config.sagas / config.rate
    stop_kills = asyncio.Event()
    started = time.monotonic()
    chaos = [
        asyncio.create_task(monkey.kill_loop(stop_kills), name="kills"),
        asyncio.create_task(monkey.outages(window), name="outages"),
        asyncio.create_task(monkey.freeze(window), name="freeze"),
        asyncio.create_task(monkey.freeze_coordinator(window), name="freeze-coordinator"),
    ]
    if config.disruption is not None:
        chaos.append(asyncio.create_task(config.disruption(system, monkey.log), name="outage"))
    progress = asyncio.create_task(_progress(system, publisher, monkey, load))
    try:
        await _publish(publisher, window + config.settle_timeout_s, monkey.log)
        await asyncio.sleep(config.chaos_tail_s)
        stop_kills.set()
        await asyncio.gather(*chaos)  # a planned outage runs to its end, the server back up
        monkey.log("chaos over; waiting for every saga to settle")
        progress.cancel()
        settled = await system.settle(len(load.sagas), config.settle_timeout_s, monkey.log)
        if settled and await resume_half(system, load, publisher, rng, monkey.log):
            settled = await system.settle(len(load.sagas), config.settle_timeout_s, monkey.log)
        duration = time.monotonic() - started
        seen = await _observe(system)
        verdict = verify(load, seen, publisher.stats.confirmed_ids)
        await _keep_database(system, say)
    finally:
        progress.cancel()
        stop_kills.set()
        for task in chaos:
            task.cancel()
        await asyncio.gather(progress, *chaos, return_exceptions=True)
    return ChaosResult(
        config=config,
        seed=seed,
        workdir=system.workdir,
        verdict=verdict,
        publish=publisher.stats,
        kills=system.supervisor.kills,
        freezes=system.supervisor.freezes,
        frozen_s=monkey.frozen_s,
        broker_restarts=system.rabbit.starts - 1,
        db_restarts=system.pg.starts - 1,
        process_exits=list(system.supervisor.exits),
        graceful_stop={},
        settled=settled,
        duration_s=duration,
        orders=len(load.orders),
        promote_s=getattr(system.pg, "promote_s", None),
    )


async def resume_half(
    system: ChaosSystem, load: Load, publisher: Publisher, rng: random.Random, log: Say
) -> int:
    """An operator's work once the chaos is over: for half the sagas in needs_human (the rest
    keep holding their orders), clear the order's faults and send ``resume``. Recorded in the
    load, whose expectations change with it (see ``load.expect``)."""
    rows = await system.pool.fetch("SELECT saga_id, order_id FROM sagas "
                                   "WHERE status = 'needs_human' ORDER BY saga_id")  # fmt: skip
    chosen = [r for r in rows if rng.random() < 0.5]
    for row in chosen:
        await clear_faults(system.pool, row["order_id"])
        load.resumed.add(row["saga_id"])
        await publisher.publish_command(ResumeSaga(
            message_id=f"resume-{row['saga_id']}", saga_id=row["saga_id"],
            order_id=row["order_id"], note="chaos: the faults are fixed",
        ))  # fmt: skip
        publisher.stats.resumes += 1
    log(f"resumed {len(chosen)} of {len(rows)} sagas in needs_human, their faults cleared")
    return len(chosen)


async def _publish(publisher: Publisher, limit_s: float, log: Say) -> None:
    """Bounded: a broker that never comes back must fail the run, not hang it."""
    try:
        await asyncio.wait_for(publisher.run(), limit_s)
    except TimeoutError:
        log(f"gave up publishing after {limit_s:.0f}s: {publisher.stats.confirmed} confirmed")
    else:
        log(f"all {publisher.stats.confirmed} starts confirmed")


async def _observe(system: ChaosSystem) -> Observed:
    for attempt in range(10):
        try:
            return await observe(system.pool)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
            if attempt == 9:
                raise
            await asyncio.sleep(1)
    raise AssertionError("unreachable")


async def _keep_database(system: ChaosSystem, say: Say) -> None:
    """The final database goes into the run directory: the register of every saga, the
    systems' effects, the logs of handled messages, for whoever investigates a violation."""
    try:
        await system.pg.dump("saga", system.workdir / "saga.dump")
    except Exception as exc:
        say(f"could not dump the database: {exc}")


async def _progress(system: ChaosSystem, publisher: Publisher, monkey: Monkey, load: Load) -> None:
    while True:
        await asyncio.sleep(5)
        try:
            row = await system.pool.fetchrow(_SETTLED_SQL)
            final = "?" if row is None else str(int(row["final"]) + int(row["held"]))
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
            final = "? (database down)"
        monkey.log(
            f"published {publisher.stats.confirmed}/{len(load.sagas)}, final {final}, "
            f"kills {sum(system.supervisor.kills.values())}, broker restarts "
            f"{system.rabbit.starts - 1}, database restarts {system.pg.starts - 1}"
        )


# --- the summary ---------------------------------------------------------------------------------


async def reverify(workdir: Path, say: Say = _say) -> Verdict:
    """Run the checks again on a kept run (its load.json and saga.dump, restored into a
    disposable Postgres): to try a corrected check, or a fix of the checker, on real evidence."""
    plans = saga_plans(chaos_catalog())
    load = Load.from_description(plans, json.loads((workdir / "load.json").read_text()))
    async with DisposablePostgres() as pg:
        await pg.restore(workdir / "saga.dump", "saga")
        pool = await asyncpg.create_pool(pg.url("saga"), min_size=1, max_size=2)
        try:
            seen = await observe(pool)
        finally:
            await pool.close()
    verdict = verify(load, seen, {s.saga_id for s in load.sagas})
    terminal = ", ".join(f"{k} {n}" for k, n in sorted(verdict.terminal.items()))
    say(
        f"{workdir}: {len(load.sagas)} sagas; terminal states {terminal}; lost {verdict.lost}; "
        f"duplicated effects {verdict.duplicated_effects}; dead letters {verdict.dead_letters}"
    )
    say("\n".join(violation_lines(verdict)) or "rule violations 0")
    return verdict


# --- command line --------------------------------------------------------------------------------
