"""Prometheus metrics: every metric the processes export, named as Prometheus recommends
(``saga_`` prefix, base units, ``_total`` for counters), and the one way to serve them.

Counters count in the process that saw the thing happen (the coordinator: sagas; an adapter:
calls); the gauges of what the database holds (blocked orders, waiting sagas, the people's
queue, the outbox) are read by the coordinator process every ``SAGA_METRICS_POLL_S``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    start_http_server,
)

from saga_shared.config import parse_bind

log = logging.getLogger(__name__)

SAGAS_STARTED = Counter("saga_started", "Sagas started", ["saga"])
SAGAS_FINISHED = Counter(
    "saga_finished",
    "Sagas that reached an end (completed, compensated, resolved) or needs_human",
    ["saga", "status"],
)
STEP_SECONDS = Histogram(
    "saga_step_duration_seconds",
    "An adapter's handling of one request: its calls and retries, until the outcome",
    ["action", "phase", "outcome"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
COMPENSATIONS = Counter(
    "saga_compensations", "Compensation requests answered by an adapter", ["action", "outcome"]
)
REQUESTS_RUNNING_ELSEWHERE = Counter(
    "saga_requests_running_elsewhere",
    "Requests acked unanswered: another live process held the key's claim (its answer counts)",
    ["action"],
)
RETRIES = Counter("saga_retries", "Calls tried again after a transient error", ["action"])
DEAD_LETTERS = Counter("saga_dead_letters", "Deliveries dead-lettered, by reason", ["reason"])
# Every reason's series exists from the start, at 0: a counter whose series appeared only at 1
# would hide the first dead letter of a reason from increase() (SagaDeadLettersGrowing). The
# broker's reasons (x-first-death-reason), then the coordinator's own.
DEAD_LETTER_REASONS = (
    "delivery_limit", "rejected", "expired", "maxlen",
    "forged", "invalid", "unroutable", "unstorable",
)  # fmt: skip
DELIVERIES = Counter(
    "saga_queue_deliveries", "Messages this process's consumers received, by queue", ["queue"]
)
HANDED_OVER = Counter(
    "saga_handed_over",
    "Requests and outcomes handed to a consumer in this process instead of published, by queue",
    ["queue"],
)
CONSUMER_RESTARTS = Counter(
    "saga_consumer_restarts", "Consumers subscribed again after the broker dropped them", ["queue"]
)
BATCH_SIZE = Histogram(
    "saga_group_commit_batch_size",
    "Partition messages applied in one coordinator transaction",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
)
GROUPS = Counter(
    "saga_group_commits",
    "Coordinator groups by how they were written: guarded (one statement on the cache), "
    "not_held (a transaction: the cache could not answer), stale (a transaction: the guard "
    "found the database changed)",
    ["path"],
)
# What the coordinator reads from Postgres (saga_coordinator.gauges): exported by the process
# that reads them only (``export_database_gauges``), never as a constant 0 by the others.
ORDERS_BLOCKED = Gauge(
    "saga_orders_blocked", "Orders held by a failed or dead-lettered message", registry=None
)
SAGAS_WAITING = Gauge(
    "saga_sagas_waiting", "Sagas queued behind another saga of their order", registry=None
)
PEOPLE_QUEUE = Gauge(
    "saga_people_queue",
    "Sagas waiting for a person (needs_human, awaiting_approval)",
    ["status"],
    registry=None,
)
PEOPLE_OLDEST = Gauge(
    "saga_people_queue_oldest_seconds",
    "How long the oldest saga of each status has waited for a person (0: none waits)",
    ["status"],
    registry=None,
)
OUTBOX_DEPTH = Gauge("saga_outbox_depth", "Committed messages not yet published", registry=None)
OUTBOX_LAG = Gauge(
    "saga_outbox_lag_seconds", "Age of the oldest unpublished message", registry=None
)
# Each component's processes by state (alive, silent), from their heartbeats
# (saga_shared.storage.presence): a component with none alive is down (SagaComponentDown).
PROCESSES = Gauge(
    "saga_processes",
    "Coordinator and adapter processes by component and state (alive: beat within three "
    "heartbeats; silent: not since)",
    ["kind", "name", "state"],
    registry=None,
)
DATABASE_GAUGES = (ORDERS_BLOCKED, SAGAS_WAITING, PEOPLE_QUEUE, PEOPLE_OLDEST, OUTBOX_DEPTH,
                   OUTBOX_LAG, PROCESSES)  # fmt: skip


def export_database_gauges(registry: CollectorRegistry = REGISTRY) -> None:
    """Export the database's gauges from this process (the coordinator's); once."""
    for gauge in DATABASE_GAUGES:
        with contextlib.suppress(ValueError):  # registered already
            registry.register(gauge)


# Set by the process's event loop itself (``heartbeat``): /metrics is served by a thread, which
# answers even while the loop is frozen; this says when the loop last ran. The health check
# (saga_app.health) reads it.
HEARTBEAT = Gauge(
    "saga_heartbeat_timestamp_seconds", "When this process's event loop last ran (Unix time)"
)
HEARTBEAT_EVERY_S = 5.0


async def heartbeat(every_s: float = HEARTBEAT_EVERY_S) -> None:
    """Until cancelled: the time, every ``every_s``, from the event loop."""
    while True:
        HEARTBEAT.set_to_current_time()
        await asyncio.sleep(every_s)


def serve(bind: str) -> bool:
    """Serve ``/metrics`` on ``host:port``; a port in use is a warning, not a stop (the
    component keeps working, unobserved)."""
    host, port = parse_bind("SAGA_METRICS_BIND", bind)
    try:
        start_http_server(port, addr=host)
    except OSError as exc:
        log.warning("metrics not served on %s: %s", bind, exc)
        return False
    log.info("metrics on http://%s/metrics", bind)
    return True
