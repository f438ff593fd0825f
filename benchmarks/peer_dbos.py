"""The refund saga on DBOS Transact, to report beside our stack: each step does the same
idempotent SQL as our adapters (the simulated systems of ``services``) while DBOS checkpoints the
workflow and every step in its own system database, on the same Postgres server, with its
default durability. ``python -m benchmarks.peer_dbos --sagas 300 --concurrency 1 8 32``"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import time
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from importlib.metadata import version
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
from dbos import DBOS, SetWorkflowID
from pydantic import JsonValue

from benchmarks.harness import cpu_seconds, pids_named, total_outcomes
from saga_services.errors import Permanent, Transient
from saga_services.faults import add_fault
from saga_services.registry import SYSTEMS
from saga_services.simulated import Simulated
from saga_shared import loop
from saga_shared.config import Settings
from saga_shared.model.catalog import ActionClass, service_of
from saga_shared.model.gateway import load_catalog
from saga_shared.model.messages import ActionRequest, Phase
from saga_shared.storage.migrations import drop_database, migrate
from saga_shared.storage.sql import create_pool

# The catalog our stack's processes load, so both run the same steps, timeouts and compensations.
CATALOG = load_catalog(Settings.from_env().catalog_file)
REFUND = CATALOG.sagas["refund"].steps
PARAMS: dict[str, JsonValue] = {
    "sku": "SKU-1", "quantity": 1, "amount_cents": 4999, "customer_email": "a@example.com"
}  # fmt: skip
WARM_UP = 4


@dataclass
class PeerResult:
    name: str
    sagas: int
    concurrency: int
    seconds: float
    latencies_ms: list[float]
    outcomes: dict[str, int]
    transactions_per_saga: float
    cpu_ms_per_saga: float  # the DBOS process(es)
    postgres_cpu_ms_per_saga: float = 0.0  # the database server meanwhile
    processes: int = 1

    @property
    def rate(self) -> float:
        return self.sagas / self.seconds

    def percentile(self, p: float) -> float:
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


class _App:
    """Steps cannot take the pool as an argument (DBOS records arguments), so they find it here."""

    pool: asyncpg.Pool | None = None


def _transient(exc: BaseException) -> bool:
    return isinstance(exc, Transient)


# Our adapters retry transient failures a few times with short backoffs; so does this step.
@DBOS.step(retries_allowed=True, interval_seconds=0.02, max_attempts=4, should_retry=_transient)  # type: ignore[untyped-decorator]
async def call_system(
    saga_id: str, order_id: str, action: str, phase: Phase, step: int, params: dict[str, JsonValue]
) -> dict[str, JsonValue]:
    spec = CATALOG.actions.get(action) or CATALOG.compensations[action]
    req = ActionRequest(
        saga_id=saga_id, order_id=order_id, action=action, phase=phase, step=step,
        idempotency_key=f"{saga_id}:{action}", params=params, timeout_s=spec.timeout_s,
    )  # fmt: skip
    assert _App.pool is not None
    async with _App.pool.acquire() as conn:
        try:  # as the adapter: the timeout covers the call, not the wait for a connection
            service = SYSTEMS[service_of(action)]
            call = service.call(req, Simulated.on(service.name, conn))
            result = await asyncio.wait_for(call, req.timeout_s)
        except TimeoutError:
            raise Transient(f"{action} timed out after {req.timeout_s}s") from None
        except Permanent as exc:
            return {"outcome": "failed", "result": None, "error": str(exc)}
    return {"outcome": "done", "result": result, "error": None}


@DBOS.workflow()  # type: ignore[untyped-decorator]
async def refund_saga(saga_id: str, order_id: str, params: dict[str, JsonValue]) -> str:
    landed: list[tuple[int, str, dict[str, JsonValue]]] = []
    for index, action in enumerate(REFUND):
        args = {name: params[name] for name in CATALOG.actions[action].params}
        try:
            out = await call_system(saga_id, order_id, action, "forward", index, args)
        except Exception:
            # Retries used up: the effect is unknown, so it is undone too, found by its key.
            landed.append((index, action, {}))
            return await _compensate(saga_id, order_id, landed)
        if out["outcome"] != "done":
            return await _compensate(saga_id, order_id, landed)
        result = out["result"]
        landed.append((index, action, result if isinstance(result, dict) else {}))
    return "completed"


async def _compensate(
    saga_id: str, order_id: str, landed: list[tuple[int, str, dict[str, JsonValue]]]
) -> str:
    """Reverse order, with the request our coordinator builds (saga_coordinator/transition.py)."""
    final = "compensated"
    for index, action, result in reversed(landed):
        spec = CATALOG.actions[action]
        if spec.action_class is ActionClass.IRREVERSIBLE:
            final = "needs_human"
        if spec.compensation is None or not spec.action_class.needs_compensation:
            continue
        params = {f: result[f] for f in spec.result if result.get(f) not in (None, "")}
        params["forward_key"] = f"{saga_id}:{action}"
        try:
            out = await call_system(
                saga_id, order_id, spec.compensation, "compensation", index, params
            )
        except Exception:
            return "needs_human"
        if out["outcome"] != "done":
            return "needs_human"
    return final


def _url(server_url: str, database: str) -> str:
    return urlunsplit(urlsplit(server_url)._replace(path=f"/{database}"))


async def _load(
    prefix: str, sagas: int, concurrency: int
) -> tuple[float, list[float], dict[str, int]]:
    window = asyncio.Semaphore(concurrency)
    latencies: list[float] = []
    outcomes: dict[str, int] = {}

    async def one(i: int) -> None:
        async with window:
            began = time.perf_counter()
            with SetWorkflowID(f"{prefix}-{i}"):
                handle = await DBOS.start_workflow_async(
                    refund_saga, f"{prefix}-{i}", f"{prefix}o-{i}", PARAMS
                )
            outcome: str = await handle.get_result()
            latencies.append((time.perf_counter() - began) * 1000)
            outcomes[outcome] = outcomes.get(outcome, 0) + 1

    started = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(sagas)))
    return time.perf_counter() - started, latencies, outcomes


@asynccontextmanager
async def _session(app_url: str, sys_url: str, concurrency: int) -> AsyncIterator[asyncpg.Pool]:
    # Sized as our coordinator's pool (at most 10), opened in full before any timing, and made
    # as our adapters make theirs.
    size = max(1, min(concurrency, 10))
    async with await create_pool(app_url, min_size=size, max_size=size) as pool:
        _App.pool = pool
        try:
            DBOS(
                config={"name": "saga-peer", "system_database_url": sys_url, "log_level": "WARNING"}
            )
            DBOS.launch()
            yield pool
        finally:
            DBOS.destroy()
            _App.pool = None
            # DBOS left its executor, now shut down, as this loop's default, which asyncpg needs
            # to resolve host names.
            asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor())


async def _commits(admin: asyncpg.Connection, databases: list[str]) -> int:
    """Committed transactions so far. Postgres 15 flushes an idle backend's counters only after
    10 s, but always when it exits: wait until the sessions on these databases are gone."""
    for _ in range(200):
        left = await admin.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = ANY($1::text[])", databases
        )
        if left == 0:
            break
        await asyncio.sleep(0.05)
    else:
        raise RuntimeError(f"sessions on {databases} did not end")
    await admin.execute("SELECT pg_stat_clear_snapshot()")
    total: int = await admin.fetchval(
        "SELECT coalesce(sum(xact_commit), 0)::bigint FROM pg_stat_database"
        " WHERE datname = ANY($1::text[])",
        databases,
    )
    return total


async def run_dbos(
    server_url: str, sagas: int, concurrency: int, *, together: bool = False
) -> PeerResult:
    """``together``: after the warm-up, say ``ready`` on stdout and start the timed load at the
    ``go`` line on stdin, so several processes time the same window."""
    run = uuid.uuid4().hex[:8]
    databases = [f"saga_peer_{run}", f"saga_peer_{run}_dbos_sys"]
    app_url, sys_url = (_url(server_url, name) for name in databases)
    admin = await asyncpg.connect(_url(server_url, "postgres"))
    try:
        await migrate(app_url)
        # A first session takes the one-off costs (DBOS creates and migrates its system
        # database); the measured one starts from the counters its backends flushed on exit.
        async with _session(app_url, sys_url, concurrency) as pool:
            for prefix, count in (("w", WARM_UP), ("t", sagas)):
                for i in range(0, count, 10):  # one in ten fails at step 2 for good
                    await add_fault(pool, "erp.create_credit_note", f"{prefix}o-{i}", "permanent")
        before = await _commits(admin, databases)
        async with _session(app_url, sys_url, concurrency):
            await _load("w", WARM_UP, min(WARM_UP, concurrency))
            if together:
                print("ready", flush=True)
                await asyncio.to_thread(sys.stdin.readline)
            cpu = resource.getrusage(resource.RUSAGE_SELF)
            server = _postgres_cpu()
            seconds, latencies, outcomes = await _load("t", sagas, concurrency)
            used = resource.getrusage(resource.RUSAGE_SELF)
            server = _postgres_cpu() - server
        after = await _commits(admin, databases)
    finally:
        await admin.close()
        try:
            await drop_database(sys_url)
        finally:
            await drop_database(app_url)
    failing = len(range(0, sagas, 10))
    expected = {"completed": sagas - failing, "compensated": failing}
    if outcomes != {k: v for k, v in expected.items() if v}:
        raise RuntimeError(f"DBOS peer: {sagas} sagas ended {outcomes}, {failing} should fail")
    cpu_ms = (used.ru_utime + used.ru_stime - cpu.ru_utime - cpu.ru_stime) * 1000
    # The count spans the session: DBOS's launch, its background polling, the warm-up sagas.
    transactions = (after - before) / (WARM_UP + sagas)
    return PeerResult(
        name=f"DBOS Transact {version('dbos')}", sagas=sagas, concurrency=concurrency,
        seconds=seconds, latencies_ms=latencies, outcomes=outcomes,
        transactions_per_saga=transactions, cpu_ms_per_saga=cpu_ms / sagas,
        postgres_cpu_ms_per_saga=server * 1000 / sagas,
    )  # fmt: skip


def _postgres_cpu() -> float:
    return sum(cpu_seconds(pid) for pid in pids_named("postgres"))


async def run_dbos_processes(
    server_url: str, sagas: int, concurrency: int, processes: int = 1
) -> PeerResult:
    """The peer in ``processes`` processes of its own (a fresh interpreter each, as a deployment
    runs it), the load and the concurrency split between them, each with its own databases;
    one result for them all, timed by the slowest."""
    share = [sagas // processes + (i < sagas % processes) for i in range(processes)]
    window = [max(1, concurrency // processes)] * processes
    env = {**os.environ, "SAGA_DATABASE_URL": server_url}
    children = []
    for n, c in zip(share, window, strict=True):
        argv = ["-m", "benchmarks.peer_dbos", "--sagas", str(n), "--concurrency", str(c)]
        children.append(await asyncio.create_subprocess_exec(
            sys.executable, *argv, "--json", "--together", env=env,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        ))  # fmt: skip
    for child in children:  # all warmed up, then all timed from one moment
        assert child.stdout is not None
        if (await child.stdout.readline()).strip() != b"ready":
            raise RuntimeError("a DBOS peer process failed before its load")
    runs = []
    for child in children:
        out, _ = await child.communicate(b"go\n")
        if child.returncode != 0:
            raise RuntimeError(f"DBOS peer process failed ({child.returncode})")
        runs.append(PeerResult(**{k: v for k, v in json.loads(out).items()
                                  if k in PeerResult.__dataclass_fields__}))  # fmt: skip
    outcomes = total_outcomes(r.outcomes for r in runs)
    return PeerResult(
        name=runs[0].name, sagas=sagas, concurrency=sum(window),
        seconds=max(r.seconds for r in runs),
        latencies_ms=[ms for r in runs for ms in r.latencies_ms], outcomes=outcomes,
        transactions_per_saga=sum(r.transactions_per_saga * r.sagas for r in runs) / sagas,
        cpu_ms_per_saga=sum(r.cpu_ms_per_saga * r.sagas for r in runs) / sagas,
        # Each process measured the server over its own window; the windows nearly coincide.
        postgres_cpu_ms_per_saga=max(r.postgres_cpu_ms_per_saga * r.sagas for r in runs) / sagas,
        processes=processes,
    )  # fmt: skip


def pooled(runs: list[PeerResult]) -> PeerResult:
    """Rounds of one configuration, measured apart, as one result."""
    total = sum(r.sagas for r in runs)
    outcomes = total_outcomes(r.outcomes for r in runs)

    def mean(field: str) -> float:
        return float(sum(getattr(r, field) * r.sagas for r in runs) / total)

    return PeerResult(
        name=runs[0].name, sagas=total, concurrency=runs[0].concurrency,
        seconds=sum(r.seconds for r in runs),
        latencies_ms=[ms for r in runs for ms in r.latencies_ms], outcomes=outcomes,
        transactions_per_saga=mean("transactions_per_saga"),
        cpu_ms_per_saga=mean("cpu_ms_per_saga"),
        postgres_cpu_ms_per_saga=mean("postgres_cpu_ms_per_saga"), processes=runs[0].processes,
    )  # fmt: skip


def _line(r: PeerResult) -> str:
    return (
        f"{r.name}, {r.sagas} sagas at concurrency {r.concurrency}: {r.rate:.1f} sagas/s, "
        f"p50 {r.percentile(50):.1f} ms, p95 {r.percentile(95):.1f} ms, "
        f"p99 {r.percentile(99):.1f} ms, outcomes {r.outcomes}, "
        f"{r.transactions_per_saga:.1f} tx/saga, {r.cpu_ms_per_saga:.2f} CPU ms/saga"
    )


def _as_json(r: PeerResult) -> dict[str, Any]:
    summary = {"rate": r.rate, **{f"p{p}_ms": r.percentile(p) for p in (50, 95, 99)}}
    return {**asdict(r), **summary}


async def _main(sagas: int, concurrencies: list[int], as_json: bool, together: bool) -> None:
    url = os.environ.get("SAGA_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/")
    for concurrency in concurrencies:
        result = await run_dbos(url, sagas, concurrency, together=together)
        print(json.dumps(_as_json(result)) if as_json else _line(result), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sagas", type=int, default=300)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.add_argument("--together", action="store_true", help="start at 'go' on stdin")
    args = parser.parse_args()
    # The peer runs on uvloop too: it is faster there (measured), and it is measured at its best.
    loop.run(_main(args.sagas, args.concurrency, args.json, args.together))
