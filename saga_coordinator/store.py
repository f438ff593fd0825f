"""The one interface to the coordinator's Postgres tables.

``apply`` is the heart of crash safety: for one consumed message it records the message in the
inbox, locks the saga row, runs the pure decision, stores the register and writes the outgoing
messages to the outbox, all in one transaction. A redelivered duplicate hits the inbox's primary
key and changes nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import asyncpg
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_delay,
    wait_exponential,
)

from saga_coordinator.machine import Transition
from saga_coordinator.register import SagaState
from shared.errors import RetryLater
from shared.messages import Envelope
from shared.sql import Queries

log = logging.getLogger(__name__)
Q = Queries(Path(__file__).with_name("queries.sql"))
RELAY_LOCK = 0x5A6A0B

# Errors after which the same transaction may well succeed: the database is restarting or
# unreachable, or two transactions collided.
TRANSIENT_DB_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.CannotConnectNowError,
    asyncpg.SerializationError,
    asyncpg.DeadlockDetectedError,
)


@dataclass(frozen=True)
class OutboxRow:
    exchange: str
    routing_key: str
    message: Envelope


@dataclass(frozen=True)
class Handled:
    transition: Transition | None  # None: a duplicate, absorbed by the inbox


class Store:
    def __init__(self, pool: asyncpg.Pool, *, db_retry_s: float = 30.0) -> None:
        self.pool = pool
        self._db_retry_s = db_retry_s

    async def _retrying(self) -> AsyncRetrying:
        return AsyncRetrying(
            retry=retry_if_exception_type(TRANSIENT_DB_ERRORS),
            wait=wait_exponential(multiplier=0.05, max=2.0),
            stop=stop_after_delay(self._db_retry_s),
            reraise=True,
        )

    async def apply(
        self,
        message: Envelope,
        decide: Callable[[SagaState | None], Transition],
        route: Callable[[Transition], Sequence[OutboxRow]],
        now: datetime,
    ) -> Handled:
        """Handle one message in one transaction, retrying the database while it is away (the
        message stays unacked meanwhile, so no delivery attempt is burnt on an outage)."""
        try:
            async for attempt in await self._retrying():
                with attempt:
                    return await self._apply_once(message, decide, route, now)
        except TRANSIENT_DB_ERRORS as exc:
            raise RetryLater(f"database unavailable: {exc}") from exc
        raise AssertionError("unreachable")  # pragma: no cover

    async def _apply_once(
        self,
        message: Envelope,
        decide: Callable[[SagaState | None], Transition],
        route: Callable[[Transition], Sequence[OutboxRow]],
        now: datetime,
    ) -> Handled:
        async with self.pool.acquire() as conn, conn.transaction():
            if not await conn.fetchval(Q.inbox_insert, message.message_id, message.saga_id):
                return Handled(None)
            raw = await conn.fetchval(Q.saga_lock, message.saga_id)
            before = None if raw is None else SagaState.model_validate_json(raw)
            transition = decide(before)
            after = transition.state
            if after is not None and transition.changed:
                body = after.model_dump_json()
                if before is None:
                    await conn.execute(
                        Q.saga_insert,
                        after.saga_id,
                        after.order_id,
                        after.saga,
                        after.status,
                        body,
                        now,
                    )
                else:
                    await conn.execute(Q.saga_update, after.saga_id, after.status, body, now)
            await conn.execute(
                Q.log_insert,
                message.saga_id,
                message.order_id,
                message.message_id,
                message.type,
                transition.note,
            )
            rows = route(transition)
            if rows:
                await conn.executemany(Q.outbox_insert, [_outbox_args(r) for r in rows])
                await conn.execute(Q.outbox_notify)
            return Handled(transition)

    async def record_rejection(
        self, *, ids: dict[str, str | None], rule: str, reason: str, body: bytes
    ) -> None:
        try:
            async for attempt in await self._retrying():
                with attempt:
                    await self.pool.execute(
                        Q.rejection_insert,
                        ids.get("message_id"),
                        ids.get("saga_id"),
                        ids.get("order_id"),
                        ids.get("type"),
                        rule,
                        reason,
                        body,
                    )
        except TRANSIENT_DB_ERRORS as exc:
            raise RetryLater(f"database unavailable: {exc}") from exc

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

    async def outbox_pending(self) -> int:
        return int(await self.pool.fetchval(Q.outbox_pending))


def _outbox_args(row: OutboxRow) -> tuple[str, str, str, str, str, bytes]:
    msg = row.message
    body = msg.model_dump_json().encode()
    return (row.exchange, row.routing_key, msg.message_id, msg.type, msg.order_id, body)
