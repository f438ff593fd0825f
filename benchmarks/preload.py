"""Fill a freshly migrated database with N finished sagas, as N real runs would have left it.

The benchmark compares an empty database with one holding a long history; what grows with that
history is tables and their indexes, so every table a finished saga leaves rows in gets them, with
the sizes and index entries of real rows. The shape of one run comes from the real code: the pure
state machine (``machine.decide``) drives each kind of saga to its end, the simulated systems'
replies are built as ``services/*/system.py`` builds them, and the SQL in ``preload.sql`` copies
that run N times with ids of its own.

``python -m benchmarks.preload --sagas N [--keep]`` does it in a new database and prints the sizes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
from pydantic import JsonValue

from benchmarks.load import command
from saga_coordinator.machine import decide
from saga_coordinator.register import TERMINAL, SagaState
from saga_services.errors import Permanent
from saga_services.outcome import Done, build_outcome
from saga_shared.config import Settings
from saga_shared.model.catalog import Catalog, service_of
from saga_shared.model.gateway import load_catalog
from saga_shared.model.messages import ActionDone, ActionFailed, ActionRequest, StartSaga
from saga_shared.storage.migrations import drop_database, migrate
from saga_shared.storage.sql import Queries

log = logging.getLogger("benchmarks.preload")
Q = Queries(Path(__file__).with_name("preload.sql"))
CHUNK = 100_000
# The work is the server's (JSON, compression, index inserts), one core per connection.
WORKERS = 2
# The templates' clock: each run falls within EPOCH's first second, which the SQL swaps for the
# saga's own; uneven microseconds, as real timestamps have, so the register compresses alike.
EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
START, TICK = timedelta(microseconds=123_457), timedelta(microseconds=9_871)
# What each saga's rows get of their own, in the order of preload.sql's chunk_fill arguments:
# its ids, its start second, the random part of each entity id the simulated systems create.
SAGA, ORDER, SECOND = "@saga@", "@order@", EPOCH.isoformat()[:19]
RES, CN, PAY, RE, EM = "@res@", "@cn@", "@pay@", "@re@", "@em@"
STAND_INS = (SAGA, ORDER, SECOND, RES, CN, PAY, RE, EM)


def _mixed_load() -> tuple[tuple[tuple[str, dict[str, JsonValue]], ...], list[int]]:
    """The benchmark's mixed load, taken from ``benchmarks.load``: its kinds of saga (name and
    parameters) and which kind saga n is (``MIX[n % 10]``)."""
    kinds: list[tuple[str, dict[str, JsonValue]]] = []
    mix = []
    for n in range(10):
        start = command("pre", n, "mixed")
        assert start.saga is not None  # the load names its sagas
        kind: tuple[str, dict[str, JsonValue]] = (start.saga, dict(start.params))
        if kind not in kinds:
            kinds.append(kind)
        mix.append(kinds.index(kind))
    return tuple(kinds), mix


KINDS, MIX = _mixed_load()
FILLS = (Q.sagas_insert, Q.orders_insert, Q.intake_seqs_insert, Q.command_seqs_insert,
         Q.inbox_insert, Q.saga_log_insert, Q.idempotency_insert, Q.effects_insert,
         Q.reservations_insert, Q.credit_notes_insert, Q.charges_insert,
         Q.emails_insert)  # fmt: skip

Reply = tuple[dict[str, JsonValue] | None, str | None, str | None, dict[str, JsonValue] | None]


@dataclass(frozen=True)
class Preloaded:
    sagas: int
    seconds: float
    rows: dict[str, int]  # table -> rows after the preload
    database_bytes: int  # pg_database_size after VACUUM ANALYZE


def _system_reply(req: ActionRequest) -> Reply:
    """(result, error, entity id, effect detail) of the simulated system, as services/*/system.py
    answer a first call that lands."""
    p, template = req.params, req.action.split(".", 1)[1]
    res, cn, pay, re, em = f"res-{RES}", f"cn-{CN}", f"pay-{PAY}", f"re-{RE}", f"em-{EM}"
    match req.action:
        case "inventory.reserve_stock":
            detail: dict[str, JsonValue] = {"sku": p["sku"], "quantity": p["quantity"]}
            return {"reservation_id": res}, None, res, detail
        case "erp.create_credit_note":
            return {"credit_note_id": cn}, None, cn, {"amount_cents": p["amount_cents"]}
        case "payments.charge_card":
            return {"payment_id": pay}, None, pay, {"amount_cents": p["amount_cents"]}
        case "erp.validate_address":
            address = " ".join(str(p["address"]).split())
            if "closed" in address.casefold():
                return None, f"address {address!r} is a closed depot", None, None
            return {"valid": True, "address": address}, None, None, None
        case "email.send_customer_email" | "email.send_confirmation":
            return {"email_id": em}, None, em, {"template": template}
        case "inventory.release_stock":
            return {"released": True, "reservation_id": res}, None, res, {}
        case "erp.void_credit_note":
            return {"voided": True, "credit_note_id": cn}, None, cn, {}
        case "payments.refund_charge":
            refunded: dict[str, JsonValue] = {"refunded": True, "payment_id": pay, "refund_id": re}
            return refunded, None, pay, {"refund_id": re}
    raise ValueError(f"preload: no simulated reply for {req.action}")


def _us(at: datetime) -> int:
    return (at - EPOCH) // timedelta(microseconds=1)


def _template(catalog: Catalog, kind: int) -> tuple[tuple[Any, ...], list[Any], list[Any]]:
    """One run of a kind of saga: (kind row, handled messages, calls to the systems)."""
    saga, params = KINDS[kind]
    message: StartSaga | ActionDone | ActionFailed | None = StartSaga(
        saga_id=SAGA, order_id=ORDER, saga=saga, params=params
    )
    state: SagaState | None = None
    messages: list[Any] = []
    calls: list[Any] = []
    while message is not None:
        now = EPOCH + START + len(messages) * TICK
        decided = decide(state, message, catalog, now)
        state = decided.state
        messages.append((kind, len(messages) + 1, message.type, decided.note, _us(now)))
        req = next((o for o in decided.out if isinstance(o, ActionRequest)), None)
        message = None
        if req is not None:
            call, message = _call(kind, len(calls) + 1, req, now + TICK / 2)
            calls.append(call)
    if state is None or state.status not in TERMINAL or _us(state.updated_at) >= 1_000_000:
        raise RuntimeError(f"preload: a {saga} run did not finish within its template's second")
    times = _us(state.created_at), _us(state.updated_at)
    row = (kind, saga, state.status, _fmt(state.model_dump_json()), len(messages), *times)
    return row, messages, calls


def _call(
    kind: int, k: int, req: ActionRequest, at: datetime
) -> tuple[tuple[Any, ...], ActionDone | ActionFailed]:
    """One call to a simulated system: its template row, and the outcome its adapter reports."""
    result, error, entity, detail = _system_reply(req)
    row = (kind, k, _fmt(req.idempotency_key), service_of(req.action), req.action,
           "failed" if error else "done", _json(result), error, entity and _fmt(entity),
           _json(detail), json.dumps(req.params), _us(at))  # fmt: skip
    verdict = Permanent(error) if error else Done(result or {})
    return row, build_outcome(req, verdict, 1)


def _json(value: dict[str, JsonValue] | None) -> str | None:
    return None if value is None else _fmt(json.dumps(value))


def _fmt(text: str) -> str:
    """A template text as a format() string: %1$s for the saga id, %2$s for its order..."""
    text = text.replace("%", "%%")
    for i, stand_in in enumerate(STAND_INS, 1):
        text = text.replace(stand_in, f"%{i}$s")
    return text


async def _load_templates(conn: asyncpg.Connection, catalog: Catalog) -> None:
    await conn.execute(Q.create_templates)
    for kind in range(len(KINDS)):
        row, messages, calls = _template(catalog, kind)
        await conn.execute(Q.kind_insert, *row)
        await conn.executemany(Q.message_insert, messages)
        await conn.executemany(Q.call_insert, calls)


async def _chunk(conn: asyncpg.Connection, first: int, last: int, start: datetime) -> None:
    async with conn.transaction():
        await conn.execute(Q.setup_only)
        await conn.execute(Q.chunk_fill, first, last, start, MIX)
        for fill in FILLS:
            await conn.execute(fill)


async def _worker(
    url: str, catalog: Catalog, chunks: Iterator[tuple[int, int]], start: datetime
) -> None:
    """Takes the next chunk until none is left; the workers share one iterator."""
    conn = await asyncpg.connect(url)
    try:
        await _load_templates(conn, catalog)
        for first, last in chunks:
            began = time.perf_counter()
            await _chunk(conn, first, last, start)
            log.info("preloaded sagas %d-%d in %.1fs", first, last, time.perf_counter() - began)
    finally:
        await conn.close()


async def preload(database_url: str, sagas: int) -> Preloaded:
    """Write ``sagas`` finished sagas (ids ``pre-saga-N``, orders ``pre-order-N``) into a
    migrated database not preloaded before, in chunks of ``CHUNK`` over ``WORKERS``
    connections, then VACUUM ANALYZE it as autovacuum would have in a database that has lived."""
    catalog = load_catalog(Settings.from_env().catalog_file)
    began = time.perf_counter()
    # Whole seconds, one saga per second, ending before now: the benchmark's sagas come later.
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=sagas + 1)
    conn = await asyncpg.connect(database_url)
    try:
        if await conn.fetchval(Q.sagas_exist):
            raise ValueError("preload: this database is preloaded already; give it a fresh one")
        chunks = ((n, min(n + CHUNK - 1, sagas)) for n in range(1, sagas + 1, CHUNK))
        async with asyncio.TaskGroup() as workers:  # one failing stops the others
            for _ in range(WORKERS):
                workers.create_task(_worker(database_url, catalog, chunks, start))
        await conn.execute(Q.vacuum_analyze)
        seconds = time.perf_counter() - began
        rows = dict(sorted((r["name"], r["n"]) for r in await conn.fetch(Q.row_counts)))
        size: int = await conn.fetchval(Q.database_bytes)
    finally:
        await conn.close()
    return Preloaded(sagas, seconds, rows, size)


async def _run(url: str, sagas: int, keep: bool) -> None:
    try:
        await migrate(url)
        result = await preload(url, sagas)
        print(f"{result.sagas} sagas in {result.seconds:.1f}s "
              f"({result.sagas / result.seconds:,.0f}/s), "
              f"database {result.database_bytes / 2**20:,.0f} MiB")  # fmt: skip
        for table, n in result.rows.items():
            print(f"  {table:28} {n:>12,}  {n / max(result.sagas, 1):6.2f} per saga")
    finally:
        if keep:
            print(f"kept {url}")
        else:
            await drop_database(url)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.preload", description=__doc__)
    parser.add_argument("--sagas", type=int, default=1_000_000)
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    server = os.environ.get("SAGA_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/")
    name = f"saga_preload_{uuid.uuid4().hex[:8]}"
    asyncio.run(_run(urlunsplit(urlsplit(server)._replace(path=f"/{name}")), args.sagas, args.keep))


if __name__ == "__main__":
    main()
