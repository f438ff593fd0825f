"""The one interface to the coordinator's Postgres tables.

``Store.run(work)`` runs ``work(tx)`` in one transaction and retries it while the database is
away (the message stays unacked meanwhile, so no delivery attempt is burnt on an outage). ``Tx``
holds every statement a transaction may need; the logic that strings them together lives in
``saga_coordinator.processor``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from saga_coordinator import guarded
from saga_coordinator.cache import RegisterCache
from saga_coordinator.convoy import Block, OrderView
from saga_coordinator.register import SagaState
from saga_coordinator.rows import Claim, OutboxRow, Parked
from saga_coordinator.writes import Writes, columns, order_row
from saga_shared.errors import RetryLater
from saga_shared.model.messages import CommandReply, Envelope
from saga_shared.model.text import clean
from saga_shared.storage.sql import TRANSIENT_DB_ERRORS, Queries, holding, is_transient
from saga_shared.transport.codec import Identity, peek
from saga_shared.transport.failures import Q as FQ

if TYPE_CHECKING:
    from saga_coordinator.ports import Transaction

log = logging.getLogger(__name__)
Q = Queries(Path(__file__).with_name("queries.sql"))
DQ = Queries(Path(__file__).with_name("dead_letters.sql"))
RELAY_LOCK = 0x5A6A0B
T = TypeVar("T")
Conn = asyncpg.Connection | PoolConnectionProxy


def _dead_letter_id(header: object) -> int | None:
    text = header.decode("ascii", "replace") if isinstance(header, bytes) else header
    if isinstance(text, str) and text.isdigit() and len(text) < 18:
        return int(text)
    return None


async def _original_sender(
    conn: Conn, header: object, message_id: str, dead_too: bool
) -> tuple[bool, str | None]:
    dl_id = _dead_letter_id(header)
    if dl_id is None:
        return False, None
    row = await conn.fetchrow(DQ.dl_original_sender, dl_id, message_id, dead_too)
    return (False, None) if row is None else (True, row["sender"])


class Tx(Writes):
    """The statements of one transaction. Created by ``Store.run``.

    Writes of the hot path (sagas, deadlines, outbox, log, order) are buffered and go as one
    statement, before the next read and at the end of ``Store.run``: one round trip instead of
    one per row. A statement sent on ``conn`` directly must not depend on them."""

    def __init__(
        self, conn: Conn, *, direct: bool = False, delete: Sequence[int] = (),
        cache: RegisterCache | None = None,
    ) -> None:  # fmt: skip
        """``direct``: the committing task publishes the outbox rows itself, right after the
        commit (the relay takes them only if it does not); ``delete``: ids of rows it published
        since, deleted with this transaction's first write; ``cache``: registers the claim
        need not read again, and where the ones written go once committed."""
        super().__init__()
        self.conn = conn
        self.direct = direct
        self._delete = list(delete)
        self._cache = cache
        self._written: dict[str, tuple[str, SagaState]] = {}  # saga id -> (row version, register)
        self._written_orders: dict[str, tuple[str, OrderView]] = {}
        self._uncached: set[str] = set()  # orders whose registers a direct statement changed
        self.sent: list[tuple[int, OutboxRow]] = []  # the outbox rows written, with their ids
        self._refusals: list[tuple[Any, ...]] = []

    async def claim(self, messages: Sequence[Envelope]) -> list[Claim]:
        """Inbox rows, order locks and saga locks of a batch (one message per order at most)
        in one round trip; the claims come in the batch's order."""
        await self.flush(before_statement=True)
        cache = self._cache
        held = [cache.get(m.saga_id) if cache is not None else None for m in messages]
        rows = await self.conn.fetch(
            Q.claim,
            [m.order_id for m in messages],
            [m.message_id for m in messages],
            [m.saga_id for m in messages],
            [entry[0] if entry is not None else "" for entry in held],
        )
        return [
            Claim(row["fresh"], _order_view(row["order_id"], row), _register(row, entry))
            for row, entry in zip(rows, held, strict=True)
        ]

    async def lock_order(self, order_id: str) -> OrderView:
        await self.flush(before_statement=True)
        row = await self.conn.fetchrow(Q.order_lock, order_id)
        assert row is not None
        return _order_view(order_id, row)

    async def block(self, order_id: str, message_id: str, state: str, reason: str) -> int:
        """Block the order by this message; returns the block's arrival number."""
        await self.flush(before_statement=True)
        arrival = await self.conn.fetchval(
            FQ.block_upsert, order_id, message_id, state, clean(reason, 2000)
        )
        return int(arrival)

    async def unblock(self, order_id: str, message_id: str) -> int | None:
        """Lift a block; returns its arrival number (None when there was none)."""
        await self.flush(before_statement=True)
        arrival = await self.conn.fetchval(Q.block_delete, order_id, message_id)
        return None if arrival is None else int(arrival)

    async def park(
        self, message: Envelope, seq: int | None, reason: str, arrival: int | None = None
    ) -> None:
        await self.flush(before_statement=True)
        body = message.model_dump_json().encode()
        await self.conn.execute(
            Q.park_insert, message.order_id, message.message_id, message.type, seq, reason, body,
            arrival,
        )  # fmt: skip

    async def replayed_sender(
        self, header: object, message_id: str, *, dead_too: bool = False
    ) -> tuple[bool, str | None]:
        """For a message an operator replayed (``x-replay-of``): whether that dead letter is
        being replayed, and who first sent it."""
        await self.flush(before_statement=True)
        return await _original_sender(self.conn, header, message_id, dead_too)

    def refusal(self, message: Envelope, rule: str, reason: str, sender: str | None) -> None:
        """A command the coordinator refused (the saga's state, or who sent it): recorded with
        the gateway's rejections, so `saga rejections` shows every refusal."""
        self._refusals.append(
            (getattr(message, "client_message_id", None) or message.message_id, message.saga_id,
             message.order_id, message.type, rule, clean(reason, 2000),
             message.model_dump_json().encode(), sender)
        )  # fmt: skip

    async def parked(self, order_id: str) -> list[Parked]:
        await self.flush(before_statement=True)
        rows = await self.conn.fetch(Q.parked_for_order, order_id)
        return [
            Parked(
                r["id"],
                r["message_id"],
                r["message_type"],
                r["seq"],
                r["reason"],
                r["body"],
                r["arrival"],
            )
            for r in rows
        ]

    async def unpark(self, parked_id: int) -> None:
        await self.flush(before_statement=True)
        await self.conn.execute(Q.parked_delete, parked_id)

    async def lock_saga(self, saga_id: str) -> SagaState | None:
        await self.flush(before_statement=True)
        raw = await self.conn.fetchval(Q.saga_lock, saga_id)
        return None if raw is None else SagaState.model_validate_json(raw)

    async def stored_reply(self, message_id: str) -> CommandReply | None:
        """The answer given to the command handled under ``message_id``, if any."""
        await self.flush(before_statement=True)
        body = await self.conn.fetchval(Q.stored_reply, message_id)
        return None if body is None else CommandReply.model_validate_json(body)

    async def applied(self, message_id: str) -> bool:
        await self.flush(before_statement=True)
        return bool(await self.conn.fetchval(Q.inbox_has, message_id))

    async def next_waiting(self, order_id: str) -> SagaState | None:
        await self.flush(before_statement=True)
        raw = await self.conn.fetchval(Q.waiting_next, order_id)
        return None if raw is None else SagaState.model_validate_json(raw)

    async def waiting_for(self, order_id: str, saga_id: str) -> None:
        """The sagas still waiting on an order now wait for ``saga_id``."""
        await self.flush(before_statement=True)
        await self.conn.execute(Q.waiting_for_update, order_id, saga_id)
        self._uncached.add(order_id)

    async def flush(self, *, before_statement: bool = False) -> None:
        """Send the buffered writes, if any, as one statement (refusals, rare, as another).
        ``before_statement``: another statement follows, which needs only the writes it may
        see or depend on; the deletion of published outbox rows, which none of them reads,
        waits for the next write (at the latest the transaction's last) instead of costing a
        round trip of its own before the claim."""
        if self._refusals:
            refusals, self._refusals = self._refusals, []
            await self.conn.execute(Q.rejection_record_refusal, *columns(refusals, 8))
        if not self.pending and (before_statement or not self._delete):
            return
        now = self._now
        sagas, out, orders, rest = self.take()
        delete, self._delete = self._delete, []
        row = await self.conn.fetchrow(
            Q.write_batch,
            [s.saga_id for s in sagas], [s.order_id for s in sagas], [s.saga for s in sagas],
            [s.status for s in sagas], [s.model_dump_json() for s in sagas], now, *rest,
            *columns([order_row(o) for o in orders], 4),
            self.direct, delete, *self.take_replies(),
        )  # fmt: skip
        assert row is not None
        self.sent.extend(zip(row["ids"], out, strict=True))
        self._written.update(
            (s.saga_id, (version, s)) for s, version in zip(sagas, row["versions"], strict=True)
        )
        self._written_orders.update(
            (o.order_id, (version, o))
            for o, version in zip(orders, row["order_versions"], strict=True)
        )

    def committed(self) -> None:
        """The transaction committed: the registers and orders it wrote are the database's
        now (but for an order a later statement of it changed); its events count."""
        self.counted()
        if self._cache is None:
            return
        for version, state in self._written.values():
            if state.order_id in self._uncached:
                self._cache.forget(state.saga_id)
            else:
                self._cache.put(version, state)
        for version, order in self._written_orders.values():
            if order.order_id in self._uncached:
                self._cache.forget_order(order.order_id)
            else:
                self._cache.put_order(version, order)


def _register(row: asyncpg.Record, held: tuple[str, SagaState] | None) -> SagaState | None:
    """The saga a claim read: none, the one held (the row is still at its version), or the
    one the database sent."""
    if row["version"] is None:
        return None
    if row["saga"] is None:
        assert held is not None  # the row is at the version held: nothing was sent
        return held[1]
    return SagaState.model_validate_json(row["saga"])


def _order_view(order_id: str, row: asyncpg.Record) -> OrderView:
    blocks = tuple(Block(b["message_id"], b["state"]) for b in json.loads(row["blocks"]))
    return OrderView(
        order_id, row["active_saga_id"], row["next_seq"], row["handled"], blocks,
        row["has_parked"], row["has_waiting"],
    )  # fmt: skip


class Store:
    def __init__(
        self, pool: asyncpg.Pool, *, db_retry_s: float = 30.0, guarded: bool = True
    ) -> None:
        """``guarded``: a group whose every message finds its saga and order in the cache is
        written in one guarded statement (``saga_coordinator.guarded``)."""
        self.pool = pool
        self._db_retry_s = db_retry_s
        self.cache = RegisterCache()
        self.guarded = guarded

    async def run(self, work: Callable[[Tx], Awaitable[T]]) -> T:
        """``work`` in one transaction, retried from the start while the database is away."""
        result, _ = await self._retrying(lambda: self._transaction(work, direct=False))
        return result

    async def run_publishing(
        self, work: Callable[[Transaction], Awaitable[T]], *, delete: Sequence[int] = ()
    ) -> tuple[T, list[tuple[int, OutboxRow]]]:
        """``run``, for a caller that publishes the outbox rows itself once committed: returns
        them with their ids too (see ``Tx``). ``work`` sees only the processor's interface, so
        it may run on the cache first and be written in one guarded statement."""

        async def once() -> tuple[T, list[tuple[int, OutboxRow]]]:
            if self.guarded:
                done = await guarded.attempt(self.pool, self.cache, work, delete)
                if done is not None:
                    return done
            try:
                return await self._transaction(work, direct=True, delete=delete)
            except asyncpg.PostgresError as exc:
                if exc.sqlstate != guarded.STALE:
                    raise
                # A saga id another order took while this one decided: decided again, the
                # claim finds it and the start is refused with a reply naming the conflict.
                return await self._transaction(work, direct=True, delete=delete)

        return await self._retrying(once)

    async def _transaction(
        self, work: Callable[[Tx], Awaitable[T]], *, direct: bool, delete: Sequence[int] = ()
    ) -> tuple[T, list[tuple[int, OutboxRow]]]:
        async with self.pool.acquire() as conn, conn.transaction():
            tx = Tx(conn, direct=direct, delete=delete, cache=self.cache)
            result = await work(tx)
            await tx.flush()
        tx.committed()
        return result, tx.sent

    async def forget_published(self, ids: Sequence[int]) -> None:
        """Delete outbox rows already published (when no transaction came to carry it)."""
        await self._retrying(lambda: self.pool.execute(Q.outbox_delete, list(ids)))

    async def _retrying(self, attempt: Callable[[], Awaitable[T]]) -> T:
        try:
            return await attempt()  # the common case pays nothing for the retry machinery
        except TRANSIENT_DB_ERRORS as exc:
            if not is_transient(exc):
                raise
            log.warning("database: %r; retrying for up to %gs", exc, self._db_retry_s)
        try:
            async for trial in holding(self._db_retry_s):
                with trial:
                    return await attempt()
        except TRANSIENT_DB_ERRORS as exc:
            if not is_transient(exc):
                raise
            raise RetryLater(f"database unavailable: {exc}") from exc
        raise AssertionError("unreachable")  # pragma: no cover

    async def record_rejection(
        self,
        ident: Identity,
        *,
        sender: str | None,
        rule: str,
        reason: str,
        body: bytes,
        keep_bytes: int,
    ) -> None:
        """A refused command, named by its ids where they are well formed; of a body over the
        size limit only the first ``keep_bytes`` are kept, with its real size."""
        ids = peek(body)

        async def work(tx: Tx) -> None:
            await tx.conn.execute(
                Q.rejection_insert, ident.message_id, ids["saga_id"], ids["order_id"],
                ids["type"], rule, clean(reason, 2000), body[:keep_bytes], ident.transport_id,
                sender, len(body),
            )  # fmt: skip

        await self.run(work)

    async def replayed_sender(self, header: object, message_id: str) -> tuple[bool, str | None]:
        async with self.pool.acquire() as conn:
            return await _original_sender(conn, header, message_id, False)

    async def order_summary(self, order_id: str) -> dict[str, Any] | None:
        row = await self.pool.fetchrow(Q.order_summary, order_id)
        return None if row is None else dict(row)

    async def assign_seq(self, message_id: str, order_id: str) -> int:
        """The order's next command number, or the one this message already got."""

        async def once() -> int:
            return int(await self.pool.fetchval(Q.seq_assign, message_id, order_id))

        return await self._retrying(once)

    # --- reads for operators ------------------------------------------------------------------
    async def get(self, saga_id: str) -> SagaState | None:
        raw = await self.pool.fetchval(Q.saga_get, saga_id)
        return None if raw is None else SagaState.model_validate_json(raw)

    async def by_order(self, order_id: str) -> list[SagaState]:
        rows = await self.pool.fetch(Q.saga_by_order, order_id)
        return [SagaState.model_validate_json(r[0]) for r in rows]

    async def order_of(self, saga_id: str) -> str | None:
        value = await self.pool.fetchval(Q.saga_order_of, saga_id)
        return None if value is None else str(value)

    async def list_sagas(
        self, status: str | None = None, order_id: str | None = None, limit: int = 100
    ) -> list[dict[str, Any]]:
        rows = await self.pool.fetch(Q.saga_list, status, order_id, limit)
        return [dict(r) for r in rows]

    async def history(self, saga_id: str) -> list[dict[str, Any]]:
        return [dict(r) for r in await self.pool.fetch(Q.log_for_saga, saga_id)]

    async def rejections(
        self, order_id: str | None = None, limit: int = 100
    ) -> list[dict[str, Any]]:
        return [dict(r) for r in await self.pool.fetch(Q.rejection_list, order_id, limit)]

    async def blocks(self, order_id: str) -> list[dict[str, Any]]:
        return [dict(r) for r in await self.pool.fetch(Q.blocks_for_order, order_id)]

    async def blocked_orders(self, limit: int = 100) -> list[dict[str, Any]]:
        return [dict(r) for r in await self.pool.fetch(Q.blocked_orders, limit)]

    async def parked(self, order_id: str) -> list[dict[str, Any]]:
        rows = await self.pool.fetch(Q.parked_for_order, order_id)
        return [{k: v for k, v in dict(r).items() if k != "body"} for r in rows]


if TYPE_CHECKING:

    def _is_a_transaction(tx: Tx) -> Transaction:
        return tx  # mypy checks here that Postgres's transaction has every method of the interface
