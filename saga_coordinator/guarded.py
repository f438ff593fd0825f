"""A group decided on what this process committed last, written in one guarded statement.

A partition's messages come back to the coordinator that wrote their sagas, so it usually holds
(``saga_coordinator.cache``) exactly what the claim would read: the order's row and view, the
saga's register, each at its row version. ``GuardedTx`` answers the claim from there, lets the
processor decide as usual, and sends everything as ``apply_batch``: one statement, its own
transaction, no BEGIN, claim or COMMIT round trip. The statement holds the database to the view
(every message new to the inbox, every row at its version, no block, no parked message, the
waiting sagas as expected) and writes only if it still holds; otherwise ``saga_guard`` aborts it
and the group runs again as a transaction under locks (``store.Tx``). So the decision is the one
the claim's reads would have given, and the write is as atomic as the transaction's.

Anything the view does not hold raises ``NotHeld`` before a statement is sent: a message whose
saga or order is not cached (a start on an unseen order is taken as new), a blocked or parked
order, and every read the processor makes beyond the claim (unblocking, parking, draining, the
next waiting saga, a replay's sender), and refusals."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import asyncpg

from saga_coordinator.cache import RegisterCache
from saga_coordinator.convoy import OrderView
from saga_coordinator.register import SagaState
from saga_coordinator.rows import Claim, OutboxRow, Parked
from saga_coordinator.writes import Writes, columns, order_row
from saga_shared.model.messages import CommandReply, Envelope
from saga_shared.observability import metrics
from saga_shared.storage.sql import Queries

if TYPE_CHECKING:
    from saga_coordinator.ports import Transaction

Q = Queries(Path(__file__).with_name("queries.sql"))
STALE = "SG001"  # saga_guard's SQLSTATE (migration 0011)
T = TypeVar("T")


class NotHeld(Exception):
    """The group needs what the cache cannot answer: it runs as a transaction instead."""


class _Held:
    """What the claim would have read for one message, as held: versions None for rows the
    message creates (a start's saga, a new order)."""

    __slots__ = ("message", "order", "order_version", "saga", "saga_version")

    def __init__(
        self, message: Envelope, order: tuple[str | None, OrderView],
        saga: tuple[str | None, SagaState | None],
    ) -> None:  # fmt: skip
        self.message = message
        self.order_version, self.order = order
        self.saga_version, self.saga = saga


def _held(cache: RegisterCache, message: Envelope) -> _Held:
    start = message.type == "saga.start"
    order = cache.order(message.order_id)
    saga = cache.get(message.saga_id)
    if (order is None or saga is None) and not start:
        raise NotHeld(f"{message.type} of order {message.order_id} is not held")
    if saga is not None and saga[1].order_id != message.order_id:
        raise NotHeld(f"saga {message.saga_id} is not of order {message.order_id}")
    held: tuple[str | None, OrderView] = order if order is not None else (
        None, OrderView(message.order_id, None, 1, 0, has_waiting=False)  # taken as a new one
    )  # fmt: skip
    if held[1].blocks or held[1].has_parked:
        raise NotHeld(f"order {message.order_id} is blocked or has parked messages")
    return _Held(message, held, saga if saga is not None else (None, None))


class GuardedTx(Writes):
    """The processor's ``Transaction`` over the cache: reads beyond the claim raise
    ``NotHeld``; writes are buffered for ``apply``."""

    def __init__(self, cache: RegisterCache, delete: Sequence[int] = ()) -> None:
        super().__init__()
        self._cache = cache
        self._delete = list(delete)
        self._held: list[_Held] = []
        self._versions: list[tuple[str, SagaState]] = []
        self._order_versions: list[tuple[str, OrderView]] = []
        self.sent: list[tuple[int, OutboxRow]] = []

    async def claim(self, messages: Sequence[Envelope]) -> list[Claim]:
        if len({m.saga_id for m in messages}) < len(messages):
            raise NotHeld("two messages of one saga")
        self._held = [_held(self._cache, m) for m in messages]
        return [Claim(True, h.order, h.saga) for h in self._held]

    async def lock_order(self, order_id: str) -> OrderView:
        raise NotHeld("an order locked again")

    async def block(self, order_id: str, message_id: str, state: str, reason: str) -> int:
        raise NotHeld("a block")

    async def unblock(self, order_id: str, message_id: str) -> int | None:
        raise NotHeld("a block lifted")

    async def park(
        self, message: Envelope, seq: int | None, reason: str, arrival: int | None = None
    ) -> None:
        raise NotHeld("a message parked")

    async def parked(self, order_id: str) -> list[Parked]:
        raise NotHeld("parked messages read")

    async def unpark(self, parked_id: int) -> None:
        raise NotHeld("a message unparked")

    async def replayed_sender(
        self, header: object, message_id: str, *, dead_too: bool = False
    ) -> tuple[bool, str | None]:
        raise NotHeld("a replay")

    def refusal(self, message: Envelope, rule: str, reason: str, sender: str | None) -> None:
        raise NotHeld("a refusal")

    async def lock_saga(self, saga_id: str) -> SagaState | None:
        raise NotHeld("a saga locked")

    async def stored_reply(self, message_id: str) -> CommandReply | None:
        raise NotHeld("a stored reply read")

    async def applied(self, message_id: str) -> bool:
        raise NotHeld("the inbox read")

    async def next_waiting(self, order_id: str) -> SagaState | None:
        raise NotHeld("a waiting saga read")

    async def waiting_for(self, order_id: str, saga_id: str) -> None:
        raise NotHeld("waiting sagas rewritten")

    async def flush(self) -> None:
        """Nothing goes before ``apply``."""

    async def apply(self, conn: asyncpg.Connection | asyncpg.pool.PoolConnectionProxy) -> None:
        """The one statement; raises asyncpg's error with ``STALE`` if the view did not hold."""
        now = self._now
        sagas, out, orders, rest = self.take()
        by_id = {h.message.saga_id: h for h in self._held}
        written = {s.saga_id for s in sagas}
        if not written <= by_id.keys():
            raise NotHeld("a saga written that no message claimed")
        unchanged = [h for h in self._held if h.message.saga_id not in written]
        if any(h.saga is None for h in unchanged):
            raise NotHeld("a start that created no saga")
        left = {o.order_id: o for o in orders}
        row = await conn.fetchrow(
            Q.apply_batch,
            [h.message.message_id for h in self._held], [h.message.saga_id for h in self._held],
            *columns([(h.order.order_id, h.order_version,
                       *order_row(left.get(h.order.order_id, h.order))[1:], h.order.has_waiting)
                      for h in self._held], 6),
            [h.message.saga_id for h in unchanged], [h.saga_version for h in unchanged],
            [s.saga_id for s in sagas], [by_id[s.saga_id].saga_version for s in sagas],
            [s.order_id for s in sagas], [s.saga for s in sagas], [s.status for s in sagas],
            [s.model_dump_json() for s in sagas], now, *rest, self._delete,
            *self.take_replies(),
        )  # fmt: skip
        assert row is not None  # held: saga_guard raised otherwise
        self.sent = list(zip(row["ids"], out, strict=True))
        self._versions = list(zip(row["versions"], sagas, strict=True))
        self._order_versions = [
            (version, left.get(h.order.order_id, h.order))
            for version, h in zip(row["order_versions"], self._held, strict=True)
        ]

    def committed(self) -> None:
        self.counted()
        for version, state in self._versions:
            self._cache.put(version, state)
        for version, order in self._order_versions:
            self._cache.put_order(version, order)

    def forget(self) -> None:
        """The view did not hold: what the cache held for the group is no longer trusted."""
        for h in self._held:
            self._cache.forget(h.message.saga_id)
            self._cache.forget_order(h.message.order_id)


async def attempt(
    pool: asyncpg.Pool,
    cache: RegisterCache,
    work: Callable[[Transaction], Awaitable[T]],
    delete: Sequence[int],
) -> tuple[T, list[tuple[int, OutboxRow]]] | None:
    """``work`` on the cache and its writes in one statement; None when the view does not hold
    (the caller runs it as a transaction). Other database errors are raised as they are."""
    tx = GuardedTx(cache, delete)
    try:
        result = await work(tx)
    except NotHeld:
        metrics.GROUPS.labels("not_held").inc()
        return None
    except Exception:
        # Decided on what the cache held, which may be what misled it: the delivery fails as
        # it would have, and its redelivery is decided on what a claim reads.
        tx.forget()
        raise
    try:
        async with pool.acquire() as conn:
            await tx.apply(conn)
    except NotHeld:
        metrics.GROUPS.labels("not_held").inc()
        return None
    except asyncpg.PostgresError as exc:
        if exc.sqlstate != STALE:
            raise
        metrics.GROUPS.labels("stale").inc()
        tx.forget()
        return None
    metrics.GROUPS.labels("guarded").inc()
    tx.committed()
    return result, tx.sent


if TYPE_CHECKING:

    def _is_a_transaction(tx: GuardedTx) -> Transaction:
        return tx  # mypy checks here that the cache-decided transaction has the whole interface
