"""A group the coordinator's cache can answer is decided without a claim and written in one
statement that holds the database to what the cache held (``saga_coordinator.guarded``). What a
user would check: the registers, log, outbox and orders are what the transaction path writes;
and whenever the database no longer holds the cached view (another coordinator took over, the
order was blocked or has parked messages, a duplicate arrived, the order is not new), nothing
of the statement stays and the message is handled as the transaction path handles it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime

import asyncpg
import pytest
from prometheus_client import REGISTRY

from saga_coordinator.processor import Processor
from saga_coordinator.rows import OutboxRow
from saga_coordinator.store import Store
from saga_shared.config import Settings
from saga_shared.model.catalog import Catalog
from saga_shared.model.gateway import load_catalog
from saga_shared.model.messages import (
    AbortSaga,
    ActionDone,
    ActionRequest,
    PartitionMessage,
    StartSaga,
)
from saga_shared.transport.failures import Q as FQ
from saga_shared.transport.topology import Topology
from tests.integration.helpers import REFUND, forget_outbox

NOW = datetime.now(UTC)


def path_counts() -> dict[str, float]:
    return {
        path: REGISTRY.get_sample_value("saga_group_commits_total", {"path": path}) or 0.0
        for path in ("guarded", "not_held", "stale")
    }


class Coordinator:
    """The coordinator's store and processor, driven one message at a time (no broker)."""

    def __init__(self, pool: asyncpg.Pool, settings: Settings, *, guarded: bool = True) -> None:
        self.catalog: Catalog = load_catalog(settings.catalog_file)
        self.store = Store(pool, guarded=guarded)
        self.processor = Processor(self.catalog, Topology.from_settings(settings))

    async def handle(self, message: PartitionMessage) -> tuple[str, list[OutboxRow], str]:
        """The note, the rows to publish, and how the group was written."""
        before = path_counts()
        notes, sent = await self.store.run_publishing(
            lambda tx: self.processor.handle_batch(tx, [message], NOW)
        )
        after = path_counts()
        path = next((p for p in after if after[p] > before[p]), "transaction")
        return notes[0], [row for _, row in sent], path

    def done(self, rows: list[OutboxRow]) -> ActionDone:
        """The adapter's answer to the request among ``rows``."""
        [request] = [
            ActionRequest.model_validate_json(r.body)
            for r in rows
            if r.message_type == "action.request"
        ]
        fields = self.catalog.actions[request.action].result
        return ActionDone(
            saga_id=request.saga_id, order_id=request.order_id, action=request.action,
            phase=request.phase, step=request.step, idempotency_key=request.idempotency_key,
            attempt=request.attempt, tries=1, result={f: f"{f}-{request.step}" for f in fields},
        )  # fmt: skip


def start(order_id: str, saga_id: str) -> StartSaga:
    return StartSaga(saga_id=saga_id, order_id=order_id, saga="refund", params=REFUND)


@pytest.fixture(autouse=True)
async def no_outbox_left(settings: Settings) -> AsyncIterator[None]:
    yield
    await forget_outbox(settings)


async def run_refund(coordinator: Coordinator, order_id: str) -> list[tuple[str, list[str], str]]:
    """A refund from its start to its end: per message, its note, what it sent and how."""
    seen = []
    note, rows, path = await coordinator.handle(start(order_id, f"{order_id}-s"))
    seen.append((note, [r.message_type for r in rows], path))
    while any(r.message_type == "action.request" for r in rows):
        note, rows, path = await coordinator.handle(coordinator.done(rows))
        seen.append((note, [r.message_type for r in rows], path))
    return seen


async def test_a_refund_is_written_as_the_transaction_path_writes_it(
    pool: asyncpg.Pool, settings: Settings, order_id: str
) -> None:
    guarded, plain = Coordinator(pool, settings), Coordinator(pool, settings, guarded=False)

    fast = await run_refund(guarded, order_id)
    slow = await run_refund(plain, order_id + "-tx")

    assert [(n, t) for n, t, _ in fast] == [(n, t) for n, t, _ in slow]
    assert [p for *_, p in fast] == ["guarded"] * 4  # the start on a new order included
    assert {p for *_, p in slow} == {"transaction"}
    a = await guarded.store.get(f"{order_id}-s")
    b = await plain.store.get(f"{order_id}-tx-s")
    assert a is not None and b is not None
    assert a.status == b.status == "completed"
    assert [(s.status, s.result, s.attempts) for s in a.steps] == [
        (s.status, s.result, s.attempts) for s in b.steps
    ]
    history = [(h["message_type"], h["note"]) for h in await guarded.store.history(a.saga_id)]
    assert history == [(h["message_type"], h["note"]) for h in await plain.store.history(b.saga_id)]
    for order in (order_id, order_id + "-tx"):
        summary = await guarded.store.order_summary(order)
        assert summary is not None
        assert (summary["active_saga_id"], summary["handled"]) == (None, 4)


async def test_a_saga_another_coordinator_changed_is_decided_on_the_database(
    pool: asyncpg.Pool, settings: Settings, order_id: str
) -> None:
    """The partition moved to another process and back: its register changed meanwhile. The
    cached one (step 0 still running) must not be used, or a second outcome of step 0 would
    start step 1 twice; nothing of the guarded attempt may stay."""
    mine, theirs = Coordinator(pool, settings), Coordinator(pool, settings)
    _, rows, _ = await mine.handle(start(order_id, f"{order_id}-s"))
    await theirs.handle(mine.done(rows))  # the other process advanced the saga to step 1

    # step 0's outcome again, under another message id (a second adapter's answer)
    note, again, path = await mine.handle(mine.done(rows))

    assert (note, again, path) == ("stale action.done for step 0", [], "stale")
    state = await mine.store.get(f"{order_id}-s")
    assert state is not None
    assert [s.status for s in state.steps] == ["done", "running", "pending"]
    assert [s.attempts for s in state.steps] == [1, 0, 0]
    log = [h["note"] for h in await mine.store.history(state.saga_id)]
    assert log[-1] == "stale action.done for step 0"
    assert len(log) == 3
    requests = await pool.fetchval(
        "SELECT count(*) FROM outbox WHERE order_id = $1 AND message_type = 'action.request'",
        order_id,
    )
    assert requests == 2  # step 0's and step 1's, once each


async def test_an_order_blocked_behind_the_caches_back_parks_the_message(
    pool: asyncpg.Pool, settings: Settings, order_id: str
) -> None:
    """A message of the order failed and the failure recorder blocked the order (it writes no
    order row): the next message must wait behind it, not be applied from the cache."""
    coordinator = Coordinator(pool, settings)
    _, rows, _ = await coordinator.handle(start(order_id, f"{order_id}-s"))
    await pool.execute(FQ.block_upsert, order_id, "m-failed", "retrying", "it failed")

    note, sent, path = await coordinator.handle(coordinator.done(rows))

    assert path == "stale"
    assert note.startswith("parked: order blocked by message m-failed")
    assert [p["message_type"] for p in await coordinator.store.parked(order_id)] == ["action.done"]
    state = await coordinator.store.get(f"{order_id}-s")
    assert state is not None and state.steps[0].status == "running"
    assert not any(r.message_type == "action.request" for r in sent)


async def test_a_message_parked_behind_the_caches_back_is_kept_in_its_place(
    pool: asyncpg.Pool, settings: Settings, order_id: str
) -> None:
    """A command numbered by the intake, parked until the command before it comes, was
    stored by another process: the order has a parked message the cache does not know of.
    The transaction path then decides (the outcome is applied, the command stays parked)."""
    coordinator = Coordinator(pool, settings)
    _, rows, _ = await coordinator.handle(start(order_id, f"{order_id}-s"))
    early = AbortSaga(saga_id=f"{order_id}-s", order_id=order_id, reason="stop", seq=3)
    await pool.execute(
        "INSERT INTO parked (order_id, message_id, message_type, seq, reason, body) "
        "VALUES ($1, $2, $3, 3, 'command 3 waits for command 2', $4)",
        order_id, early.message_id, early.type, early.model_dump_json().encode(),
    )  # fmt: skip

    note, _, path = await coordinator.handle(coordinator.done(rows))

    assert (note, path) == ("step 0 done", "stale")
    state = await coordinator.store.get(f"{order_id}-s")
    assert state is not None and [s.status for s in state.steps][:2] == ["done", "running"]
    assert [p["message_id"] for p in await coordinator.store.parked(order_id)] == [early.message_id]


async def test_a_duplicate_with_everything_cached_is_absorbed_once(
    pool: asyncpg.Pool, settings: Settings, order_id: str
) -> None:
    coordinator = Coordinator(pool, settings)
    _, rows, _ = await coordinator.handle(start(order_id, f"{order_id}-s"))
    done = coordinator.done(rows)
    _, _, path = await coordinator.handle(done)
    assert path == "guarded"

    note, again, path = await coordinator.handle(done)

    assert (note, again, path) == ("duplicate absorbed", [], "stale")
    state = await coordinator.store.get(f"{order_id}-s")
    assert state is not None
    assert [s.status for s in state.steps] == ["done", "running", "pending"]
    assert [s.attempts for s in state.steps] == [1, 0, 0]


async def test_a_start_on_an_order_held_elsewhere_waits(
    pool: asyncpg.Pool, settings: Settings, order_id: str
) -> None:
    """This process has not seen the order, so it takes it as new; another process's saga
    holds it, so the guard fails and the new saga waits its turn."""
    other, mine = Coordinator(pool, settings), Coordinator(pool, settings)
    await other.handle(start(order_id, f"{order_id}-first"))

    note, rows, path = await mine.handle(start(order_id, f"{order_id}-second"))

    assert path == "stale"
    assert not any(r.message_type == "action.request" for r in rows)
    second = await mine.store.get(f"{order_id}-second")
    assert second is not None
    assert (second.status, second.waiting_for) == ("waiting", f"{order_id}-first")
    assert note


async def test_the_cache_follows_the_guarded_writes(
    pool: asyncpg.Pool, settings: Settings, order_id: str
) -> None:
    """Each guarded statement leaves the cache at the rows' new versions, so the next message
    is guarded too; an order edited by hand is read again."""
    coordinator = Coordinator(pool, settings)
    _, rows, _ = await coordinator.handle(start(order_id, f"{order_id}-s"))
    _, rows, path = await coordinator.handle(coordinator.done(rows))
    assert path == "guarded"
    version = await pool.fetchval("SELECT xmin::text FROM orders WHERE order_id = $1", order_id)
    held = coordinator.store.cache.order(order_id)
    assert held is not None and held[0] == version

    await pool.execute("UPDATE orders SET updated_at = now() WHERE order_id = $1", order_id)
    _, _, path = await coordinator.handle(coordinator.done(rows))

    assert path == "stale"
    summary = await coordinator.store.order_summary(order_id)
    assert summary is not None and summary["handled"] == 3


def started_count() -> float:
    return REGISTRY.get_sample_value("saga_started_total", {"saga": "refund"}) or 0.0


async def test_the_saga_counters_count_what_committed_not_what_the_guard_refused(
    pool: asyncpg.Pool, settings: Settings, order_id: str
) -> None:
    """A start decided on the cache as the first of a new order (saga.started) that the guard
    refused, then decided under locks as a saga that waits, counts as the transaction path
    counts it: not as started."""
    counted = []
    for guarded, order in ((True, order_id), (False, order_id + "-tx")):
        other, mine = Coordinator(pool, settings), Coordinator(pool, settings, guarded=guarded)
        await other.handle(start(order, f"{order}-first"))
        before = started_count()
        *_, path = await mine.handle(start(order, f"{order}-second"))
        counted.append((path, started_count() - before))

    assert counted == [("stale", 0.0), ("transaction", 0.0)]
