"""Reads what the database holds into the gauges of ``saga_shared.observability.metrics``:
blocked orders, waiting sagas, the people's queue, the outbox, the processes alive and silent.
Runs in the coordinator process."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import asyncpg

from saga_shared.observability import metrics
from saga_shared.storage.sql import Queries

log = logging.getLogger(__name__)
Q = Queries(Path(__file__).with_name("gauges.sql"))


# A process is silent once it missed this many heartbeats (the console uses the same rule).
SILENT_AFTER_BEATS = 3


async def read_gauges(
    pool: asyncpg.Pool, namespace: str = "saga", heartbeat_s: float = 5.0
) -> None:
    row = await pool.fetchrow(Q.gauges)
    assert row is not None
    metrics.ORDERS_BLOCKED.set(row["orders_blocked"])
    metrics.SAGAS_WAITING.set(row["waiting"])
    metrics.PEOPLE_QUEUE.labels("needs_human").set(row["needs_human"])
    metrics.PEOPLE_QUEUE.labels("awaiting_approval").set(row["awaiting_approval"])
    for status in ("needs_human", "awaiting_approval"):
        metrics.PEOPLE_OLDEST.labels(status).set(float(row[f"{status}_oldest_s"] or 0))
    metrics.OUTBOX_DEPTH.set(row["outbox_depth"])
    metrics.OUTBOX_LAG.set(float(row["outbox_lag_s"] or 0))
    silent_after_s = heartbeat_s * SILENT_AFTER_BEATS
    await pool.execute(Q.processes_replaced, silent_after_s)
    await pool.execute(Q.processes_forget)
    metrics.PROCESSES.clear()  # a component forgotten is no longer exported
    for p in await pool.fetch(Q.processes, silent_after_s, namespace):
        for state in ("alive", "silent"):
            metrics.PROCESSES.labels(p["kind"], p["name"], state).set(p[state])


async def keep_gauges(
    pool: asyncpg.Pool, every_s: float, namespace: str = "saga", heartbeat_s: float = 5.0
) -> None:
    metrics.export_database_gauges()
    while True:
        try:
            await read_gauges(pool, namespace, heartbeat_s)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the database away: the gauges keep their last values
            log.warning("gauges not read: %r", exc)
        await asyncio.sleep(every_s)
