"""The coordinator's database in the simulation: the in-memory store
(``saga_coordinator.memory``, held to the Postgres store's contract), shared by every
coordinator process as Postgres is, which a fault can take away for a while. While it is away a
transaction raises what asyncpg raises for a lost connection, so the product's own rule
(``saga_shared.storage.sql.is_transient``) decides whether a message is held or fails."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import asyncpg

from saga_coordinator.memory import MemoryStore, MemoryTx
from saga_coordinator.rows import OutboxRow
from saga_shared.errors import RetryLater
from saga_shared.storage import sql

log = logging.getLogger(__name__)
T = TypeVar("T")
HOLD_S = 30.0  # as Store's db_retry_s: how long a message is held while the database is away


class SimStore:
    def __init__(self, clock: Callable[[], float]) -> None:
        self.memory = MemoryStore()
        self.clock = clock
        self.down_until = 0.0
        self.written: dict[int, float] = {}  # outbox row id -> when it was committed
        self.commits = 0
        self.refused = 0

    def down(self) -> bool:
        return self.clock() < self.down_until

    def _check(self) -> None:
        """While the database is away: what asyncpg raises then, one kind and the other in
        turn (a pooled connection the server dropped fails with ``InternalClientError``: the
        outage chaos test found it, and it must count as the database being away)."""
        if not self.down():
            return
        self.refused += 1
        if self.refused % 2:
            raise asyncpg.exceptions._base.InternalClientError("cannot switch to state 12")
        raise asyncpg.exceptions.ConnectionDoesNotExistError(
            "connection was closed in the middle of operation (the database is away)"
        )

    async def run_publishing(
        self, work: Callable[[MemoryTx], Awaitable[T]]
    ) -> tuple[T, list[tuple[int, OutboxRow]]]:
        self._check()
        result, sent = await self.memory.run_publishing(work)
        now = self.clock()
        for row_id, _ in sent:
            self.written[row_id] = now
        self.commits += 1
        return result, sent

    async def run(self, work: Callable[[MemoryTx], Awaitable[T]]) -> T:
        result, _ = await self.run_publishing(work)
        return result

    async def run_held(
        self, work: Callable[[MemoryTx], Awaitable[T]]
    ) -> tuple[T, list[tuple[int, OutboxRow]]]:
        """``Store``'s hold: retried with backoff while the database is away (the message
        stays in hand, no delivery attempt burnt), for ``HOLD_S``, then ``RetryLater``."""
        wait, waited = 0.05, 0.0
        while True:
            try:
                return await self.run_publishing(work)
            except sql.TRANSIENT_DB_ERRORS as exc:  # read at each try: a test may patch it
                if not sql.is_transient(exc):
                    raise
                if waited >= HOLD_S:
                    raise RetryLater(f"database unavailable: {exc}") from exc
            await asyncio.sleep(wait)
            waited += wait
            wait = min(wait * 2, 2.0)

    def forget(self, ids: Sequence[int]) -> None:
        """Rows published and confirmed: deleted."""
        if not ids:
            return
        gone = set(ids)
        state = self.memory.state
        state.outbox = [(i, row) for i, row in state.outbox if i not in gone]
        for i in gone:
            self.written.pop(i, None)

    def stale(self, age_s: float) -> list[tuple[int, OutboxRow]]:
        """Rows committed at least ``age_s`` ago and still here, in id order."""
        if self.down():
            return []
        limit = self.clock() - age_s
        return [(i, row) for i, row in self.memory.state.outbox if self.written.get(i, 0) <= limit]
