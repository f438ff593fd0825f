"""The coordinator's watch of its request queues (``saga_coordinator.queue_watch``): a queue
found gone is declared again and every request that was out to its service is handed a
lost-marked deadline through its order's partition; when that fails half way, the next look
finishes it, though the queue, declared by then, no longer says it was gone."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, cast

from saga_coordinator.queue_watch import QueueWatch
from saga_coordinator.rows import OutboxRow
from saga_coordinator.store import Store
from saga_shared.config import Settings
from saga_shared.model.messages import DeadlineReached
from saga_shared.transport.bus import Bus
from saga_shared.transport.topology import Topology

T = Topology("w", 4, 5, declared_services=("inventory", "erp"))
ARMED = [  # what the deadlines table holds: requests out, a gate, a settle
    {"saga_id": "s1", "order_id": "o1", "step": 0, "phase": "forward",
     "idempotency_key": "s1:inventory.reserve_stock", "attempt": 1},
    {"saga_id": "s2", "order_id": "o2", "step": 1, "phase": "compensation",
     "idempotency_key": "s2:inventory.release_stock", "attempt": 2},
    {"saga_id": "s3", "order_id": "o3", "step": 1, "phase": "forward",
     "idempotency_key": "s3:erp.create_credit_note", "attempt": 1},
    {"saga_id": "s4", "order_id": "o4", "step": 2, "phase": "gate",
     "idempotency_key": "s4:inventory.reserve_stock:gate", "attempt": 1},
]  # fmt: skip


class Broker:
    def __init__(self) -> None:
        self.topology = T
        self.queues = set(T.all_queues()) - {T.request_queue("inventory")}  # lost
        self.declared = 0

    async def missing(self, names: Sequence[str]) -> list[str]:
        return [n for n in names if n not in self.queues]

    async def declare(self, *, requests: bool = True) -> None:
        self.declared += 1
        self.queues |= set(T.all_queues())


class Conn:
    async def fetch(self, _query: str, patterns: list[str]) -> list[dict[str, Any]]:
        return [r for r in ARMED if any(p.strip("%") in str(r["idempotency_key"])
                                        for p in patterns)]  # fmt: skip


class Tx:
    def __init__(self) -> None:
        self.conn = Conn()
        self.rows: list[OutboxRow] = []

    def outbox(self, rows: Sequence[OutboxRow]) -> None:
        self.rows += rows


class Database:
    def __init__(self, away: int = 0) -> None:
        self.away = away
        self.written: list[OutboxRow] = []

    async def run(self, work: Callable[[Tx], Awaitable[Any]]) -> Any:
        if self.away:
            self.away -= 1
            raise ConnectionError("the database is away")
        tx = Tx()
        result = await work(tx)
        self.written += tx.rows
        return result


def watch(database: Database, broker: Broker) -> QueueWatch:
    return QueueWatch(Settings(watchdog_s=0.01), cast(Bus, broker), cast(Store, database))


def marks(database: Database) -> list[tuple[str, str, int, str | None]]:
    out: list[tuple[str, str, int, str | None]] = []
    for row in database.written:
        m = DeadlineReached.model_validate_json(row.body)
        assert row.routing_key == T.partition_key(m.order_id)
        out.append((m.saga_id, m.phase, m.attempt, m.lost))
    return out


async def test_a_queue_found_gone_is_declared_and_what_was_out_to_it_sent_again() -> None:
    database, broker = Database(), Broker()
    task = asyncio.create_task(watch(database, broker).run())
    await asyncio.sleep(0.1)
    task.cancel()

    assert broker.declared == 1  # found once: declared, and then found there
    assert marks(database) == [("s1", "forward", 1, "inventory"),
                               ("s2", "compensation", 2, "inventory")]  # fmt: skip


async def test_a_resend_the_database_refused_is_finished_by_the_next_look() -> None:
    database, broker = Database(away=1), Broker()
    task = asyncio.create_task(watch(database, broker).run())
    await asyncio.sleep(0.1)
    task.cancel()

    assert T.request_queue("inventory") in broker.queues
    assert [m[0] for m in marks(database)] == ["s1", "s2"]


async def test_told_to_look_now_it_looks_without_waiting_for_its_interval() -> None:
    # After a reconnection (Bus.on_reconnect): the broker may have restarted meanwhile.
    database, broker = Database(), Broker()
    lazy = QueueWatch(Settings(watchdog_s=3600.0), cast(Bus, broker), cast(Store, database))
    task = asyncio.create_task(lazy.run())
    await asyncio.sleep(0.05)
    assert broker.declared == 0  # an hour to the first look
    lazy.look_now()
    for _ in range(100):
        if broker.declared:
            break
        await asyncio.sleep(0.01)
    task.cancel()
    assert broker.declared == 1
    assert [m[0] for m in marks(database)] == ["s1", "s2"]
