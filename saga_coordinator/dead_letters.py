"""Dead letters: the ingester that stores them in Postgres, and the desk operators replay or
discard them from.

The ingester acks a dead letter only after its row is committed (a crash in between redelivers
it, and the message id or the ``x-replay-of`` header finds the same row). Every dead letter of
a known order blocks that order until an operator replays or discards it.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiormq
from aio_pika.abc import AbstractIncomingMessage

from saga_coordinator.processor import Processor
from saga_coordinator.store import OutboxRow, Store, Tx
from shared.bus import Bus
from shared.codec import identify_incoming
from shared.config import Settings
from shared.errors import SagaError
from shared.sql import Queries

log = logging.getLogger(__name__)
Q = Queries(Path(__file__).with_name("dead_letters.sql"))
REPLAY_HEADER = "x-replay-of"


class DeadLetterNotFound(SagaError):
    pass


@dataclass(frozen=True)
class Death:
    """Where a message was going and why it died, read from the broker's x-death headers."""

    reason: str
    queue: str | None
    exchange: str
    routing_key: str
    count: int
    at: datetime


def read_death(headers: dict[str, Any], now: datetime) -> Death:
    deaths = [d for d in headers.get("x-death") or [] if isinstance(d, dict)]
    queue = _text(headers.get("x-first-death-queue"))
    entry = next(
        (d for d in deaths if _text(d.get("queue")) == queue), deaths[-1] if deaths else {}
    )
    keys = entry.get("routing-keys") or [""]
    at = entry.get("time")
    return Death(
        reason=_text(headers.get("x-first-death-reason"))
        or _text(entry.get("reason"))
        or "unknown",
        queue=queue or _text(entry.get("queue")),
        exchange=_text(entry.get("exchange")) or _text(headers.get("x-first-death-exchange")) or "",
        routing_key=_text(keys[0]) or "",
        count=int(entry.get("count") or 1),
        at=at if isinstance(at, datetime) else now,
    )


def _text(value: Any) -> str | None:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) else None


def jsonable_headers(headers: dict[str, Any]) -> str:
    def convert(value: Any) -> Any:
        if isinstance(value, bytes):
            return value.decode("utf-8", "replace")
        if isinstance(value, dict):
            return {str(k): convert(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [convert(v) for v in value]
        if isinstance(value, datetime):
            return value.isoformat()
        return value if isinstance(value, str | int | float | bool) or value is None else str(value)

    return json.dumps(convert(headers))


UNROUTABLE_ERRORS: tuple[type[BaseException], ...] = (
    aiormq.exceptions.ChannelNotFoundEntity,
    aiormq.exceptions.DeliveryError,
)


@dataclass(frozen=True)
class Letter:
    """One dead message as stored: where it was going, why it died, what it was."""

    message_id: str
    message_type: str | None
    order_id: str | None
    saga_id: str | None
    queue: str | None
    exchange: str
    routing_key: str
    reason: str
    error: str | None
    attempts: int
    first_at: datetime
    last_at: datetime
    headers: dict[str, Any]
    body: bytes


async def record_death(tx: Tx, letter: Letter) -> int:
    """Store a dead letter, or return a replayed one to its row (its history kept), and block
    its order. A replay header that names no row (forged, or the row was purged) must not make
    the letter vanish: it is then stored as a new one."""
    info = (letter.reason, letter.error, letter.attempts, letter.first_at, letter.last_at,
            jsonable_headers(letter.headers))  # fmt: skip
    replay_of = _text(letter.headers.get(REPLAY_HEADER))
    for existing in (
        int(replay_of) if replay_of and replay_of.isdigit() else None,
        await tx.conn.fetchval(Q.dl_lock_by_message, letter.message_id),
    ):
        if existing is not None and await tx.conn.fetchval(Q.dl_dead_again, existing, *info):
            dl_id = int(existing)
            break
    else:
        dl_id = await tx.conn.fetchval(
            Q.dl_insert, letter.message_id, letter.message_type, letter.order_id,
            letter.saga_id, letter.queue, letter.exchange, letter.routing_key, *info, letter.body,
        )  # fmt: skip
    if letter.order_id:
        reason = f"dead-lettered ({letter.reason}): {letter.error or 'no error recorded'}"
        await tx.block(letter.order_id, letter.message_id, "dead", reason)
    return dl_id


async def bury_unroutable(tx: Tx, row: Any, error: BaseException) -> None:
    """An outbox row the broker cannot route (its exchange is gone, no queue is bound) becomes
    a dead letter instead of wedging the relay: it is kept, its order blocked, for an operator."""
    now = _now()
    await record_death(
        tx,
        Letter(
            message_id=row["message_id"], message_type=row["message_type"],
            order_id=row["order_id"] or None, saga_id=None, queue=None,
            exchange=row["exchange"], routing_key=row["routing_key"], reason="unroutable",
            error=f"{type(error).__name__}: {error}", attempts=1, first_at=now, last_at=now,
            headers=json.loads(row["headers"]), body=row["body"],
        ),
    )  # fmt: skip


class DeadLetterIngester:
    def __init__(self, settings: Settings, bus: Bus, store: Store) -> None:
        self.settings = settings
        self.bus = bus
        self.store = store

    async def handle(self, delivery: AbstractIncomingMessage) -> None:
        headers = dict(delivery.headers or {})
        ident = identify_incoming(delivery)
        death = read_death(headers, datetime.now(UTC))

        async def work(tx: Tx) -> int:
            # the consumer that gave up recorded why; the broker only says how it ended
            failure = await tx.conn.fetchrow(Q.failure_get, ident.message_id)
            letter = Letter(
                message_id=ident.message_id, message_type=ident.message_type,
                order_id=ident.order_id, saga_id=ident.saga_id, queue=death.queue,
                exchange=death.exchange, routing_key=death.routing_key, reason=death.reason,
                error=failure["last_error"] if failure else None,
                attempts=failure["attempts"] if failure else death.count,
                first_at=failure["first_at"] if failure else death.at, last_at=death.at,
                headers=headers, body=delivery.body,
            )  # fmt: skip
            return await record_death(tx, letter)

        dl_id = await self.store.run(work)
        log.warning("dead letter %s: %s %s (%s)", dl_id, ident.message_type, ident.message_id,
                    death.reason)  # fmt: skip

    async def run(self) -> None:
        await self.bus.consume(
            self.bus.topology.dead_letter_queue, self.handle, prefetch=16, mode="sequential"
        )


@dataclass(frozen=True)
class Handled:
    dead_letter_id: int
    done: bool
    detail: str


class DeadLetterDesk:
    """What an operator does with a dead letter. Each operation is one transaction."""

    def __init__(self, store: Store, processor: Processor) -> None:
        self.store = store
        self.processor = processor
        self.topology = processor.topology

    def _reenters_convoy(self, exchange: str) -> bool:
        # Such a message comes back through the order's partition with the same id and lifts
        # the block itself when handled; any other (an action request) lifts it now.
        return exchange in (self.topology.partitions_exchange, self.topology.commands_exchange)

    async def replay(self, dl_id: int, actor: str, note: str = "") -> Handled:
        async def work(tx: Tx) -> Handled:
            row = await tx.conn.fetchrow(Q.dl_lock, dl_id)
            if row is None:
                raise DeadLetterNotFound(f"no dead letter {dl_id}")
            if row["status"] != "dead":
                return Handled(dl_id, False, f"already {row['status']}: nothing republished")
            tx.outbox([
                OutboxRow(row["exchange"], row["routing_key"], row["message_id"],
                          row["message_type"] or "unknown", row["order_id"] or "", row["body"],
                          {REPLAY_HEADER: str(dl_id)})
            ])  # fmt: skip
            await tx.conn.execute(Q.dl_set_status, dl_id, "replayed")
            await tx.conn.execute(Q.audit_insert, dl_id, "replay", actor, note)
            await tx.conn.execute(Q.failure_delete, row["message_id"])
            target = f"{row['exchange'] or '(default)'} / {row['routing_key']}"
            if row["order_id"] is not None:
                if self._reenters_convoy(row["exchange"]):
                    await tx.block(
                        row["order_id"], row["message_id"], "replaying", f"replayed by {actor}"
                    )
                else:
                    await self.processor.release(tx, row["order_id"], row["message_id"], _now())
            return Handled(dl_id, True, f"republished to {target}")

        return await self.store.run(work)

    async def discard(self, dl_id: int, actor: str, reason: str) -> Handled:
        async def work(tx: Tx) -> Handled:
            row = await tx.conn.fetchrow(Q.dl_lock, dl_id)
            if row is None:
                raise DeadLetterNotFound(f"no dead letter {dl_id}")
            if row["status"] == "discarded":
                return Handled(dl_id, False, "already discarded")
            await tx.conn.execute(Q.dl_set_status, dl_id, "discarded")
            await tx.conn.execute(Q.audit_insert, dl_id, "discard", actor, reason)
            if row["order_id"] is not None:
                await self._skip_its_number(tx, row)
                await self.processor.release(tx, row["order_id"], row["message_id"], _now())
            return Handled(dl_id, True, "discarded; its order is unblocked")

        return await self.store.run(work)

    async def _skip_its_number(self, tx: Tx, row: Any) -> None:
        """A discarded command never arrives: later commands of its order must not wait for it."""
        seq = await tx.conn.fetchval(Q.seq_of_message, row["message_id"])
        if seq is None:
            return
        await tx.conn.execute(
            Q.tombstone_insert, row["order_id"], f"skip:{row['message_id']}", seq,
            f"command {seq} discarded",
        )  # fmt: skip

    async def ids(self, order_id: str | None) -> list[int]:
        return [r["id"] for r in await self.store.pool.fetch(Q.dl_ids_dead, order_id)]

    async def list(
        self,
        order_id: str | None = None,
        reason: str | None = None,
        since: datetime | None = None,
        status: str | None = None,
        limit: int = 100,
    ) -> list[dict[str, Any]]:
        rows = await self.store.pool.fetch(Q.dl_list, order_id, reason, since, status, limit)
        return [dict(r) for r in rows]

    async def get(self, dl_id: int) -> dict[str, Any]:
        row = await self.store.pool.fetchrow(Q.dl_get, dl_id)
        if row is None:
            raise DeadLetterNotFound(f"no dead letter {dl_id}")
        found = dict(row)
        found["headers"] = json.loads(found["headers"])
        found["history"] = json.loads(found["history"])
        found["audit"] = [dict(r) for r in await self.store.pool.fetch(Q.audit_for, dl_id)]
        order_id = found["order_id"]
        found["parked_behind"] = await self.store.parked(order_id) if order_id else []
        found["blocks"] = await self.store.blocks(order_id) if order_id else []
        return found


def _now() -> datetime:
    return datetime.now(UTC)
