"""The outbox relay: publishes committed outgoing messages in id order, with confirms.

One relay publishes at a time (a session advisory lock on its own connection), so several
coordinator processes never reorder one order's messages. The server ends the session of a
relay that stopped (frozen) after ``SAGA_PARTITION_LEASE_S``, and another relay leads. A row is
deleted only after its confirm; a crash in between republishes it, and the receivers absorb the
duplicate by message id.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

import asyncpg
from aio_pika.exceptions import CONNECTION_EXCEPTIONS as AMQP_AWAY
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_exponential

from saga_coordinator.dead_letters import bury_unroutable
from saga_coordinator.ownership import lock_session
from saga_coordinator.sender import Recover
from saga_coordinator.store import RELAY_LOCK, Conn, Q, Tx
from saga_shared.config import Settings
from saga_shared.crashpoints import crash_point
from saga_shared.observability.logs import log_debug
from saga_shared.storage.sql import TRANSIENT_DB_ERRORS, is_transient
from saga_shared.transport.bus import Bus, refused_for_now, unroutable
from saga_shared.transport.codec import Outgoing, to_amqp

log = logging.getLogger(__name__)


class Relay:
    """``url``: the database as the coordinator (the relay's own lock and LISTEN connections)."""

    def __init__(
        self, settings: Settings, pool: asyncpg.Pool, bus: Bus, url: str | None = None,
        recover: Recover | None = None,
    ) -> None:  # fmt: skip
        """``recover``: as the sender's (a request queue a publish found gone)."""
        self.settings = settings
        self._recover = recover or (lambda _: bus.declare())
        self.pool = pool
        self.bus = bus
        self.url = url or settings.database_url
        self._wake = asyncio.Event()
        self._conn: asyncpg.Connection | None = None
        self._leading = False

    def _on_notify(self, *_: Any) -> None:
        self._wake.set()

    async def _lead(self) -> asyncpg.Connection | None:
        """The relay's own connection while it holds the relay lock, else None. The lock is
        the session's: held for as long as the connection lives, so a batch costs two
        statements and no transaction, and it passes to another relay when this one dies."""
        if self._conn is None or self._conn.is_closed():
            # A frozen relay's session is ended by the server, so its lock passes: the rows only
            # the relay publishes (deadlines, resends) would otherwise wait for it to wake.
            self._conn = await asyncpg.connect(
                self.url, server_settings=lock_session(self.settings, "relay")
            )
            self._leading = False
        if not self._leading:
            self._leading = bool(await self._conn.fetchval(Q.relay_lead, RELAY_LOCK))
        return self._conn if self._leading else None

    async def flush_once(self, *, everything: bool = False) -> int:
        """Publish one batch: the rows written for the relay, and rows their committing task
        has not published within ``outbox_stale_s`` (``everything``: all rows, at a stop)."""
        conn = await self._lead()
        if conn is None:
            return 0
        stale = 0.0 if everything else self.settings.outbox_stale_s
        rows = await conn.fetch(Q.outbox_batch, self.settings.relay_batch, stale)
        if not rows:
            return 0
        crash_point("relay.before_publish")
        errors = await self.bus.publish_many(
            [(r["exchange"], r["routing_key"], _message(r)) for r in rows]
        )
        settled = [r["id"] for r, e in zip(rows, errors, strict=True) if e is None]
        async with contextlib.AsyncExitStack() as stack:
            if any(errors):
                await stack.enter_async_context(conn.transaction())  # a burial and the delete
            for row, error in zip(rows, errors, strict=True):
                # One by one and in order now: an unroutable row may have closed the channel
                # under the rows behind it.
                if error is not None and await self._publish_alone(conn, row):
                    settled.append(row["id"])
            crash_point("relay.after_publish")
            await conn.execute(Q.outbox_delete, settled)
        return len(rows)

    async def _publish_alone(self, conn: Conn, row: asyncpg.Record) -> bool:
        """Whether the row is settled: published, or buried as a dead letter because it can
        never be routed. A row the broker refused for now (nacked) stays for the next round;
        any other error (the broker away) goes up, to the relay's retry with backoff."""
        try:
            await self.bus.publish_raw(row["exchange"], row["routing_key"], _message(row))
        except Exception as exc:
            if refused_for_now(exc):
                log.warning("outbox row %s refused by the broker for now, kept: %s", row["id"], exc)
                return False
            if not unroutable(exc):
                raise
            if self.bus.topology.is_request_route(row["exchange"], row["routing_key"]):
                # Its queue went with its node (or a broker restart): declared again, and the
                # row is sent in the next round; a request is never buried.
                log.warning("outbox row %s: its request queue is gone; declaring it again: %s",
                            row["id"], exc)  # fmt: skip
                await self._recover({row["routing_key"].removeprefix("request.")})
                return False
            log.error("outbox row %s cannot be routed: %s", row["id"], exc)
            await bury_unroutable(Tx(conn), row, exc)
        return True

    async def drain(self) -> None:
        """Publish until the outbox is empty (used at a graceful stop)."""
        while await self.flush_once(everything=True) == self.settings.relay_batch:
            pass

    async def run(self) -> None:
        listen = asyncio.create_task(self._listen())
        try:
            await self._loop()
        finally:
            listen.cancel()
            await asyncio.gather(listen, return_exceptions=True)
            if self._conn is not None:
                with contextlib.suppress(Exception):
                    await self._conn.close()
                self._conn = None

    async def _listen(self) -> None:
        """Keep a LISTEN connection for low latency, reconnecting after a database restart;
        meanwhile the relay polls, so nothing depends on it."""
        while True:
            listener: asyncpg.Connection | None = None
            try:
                listener = await asyncpg.connect(self.url)
                await self._hold(listener)
            except TRANSIENT_DB_ERRORS:
                log.debug("outbox relay: LISTEN connection lost; polling meanwhile")
            finally:
                if listener is not None:
                    with contextlib.suppress(Exception):
                        await listener.close()
            await asyncio.sleep(1.0)

    async def _hold(self, listener: asyncpg.Connection) -> None:
        lost = asyncio.Event()
        listener.add_termination_listener(lambda _: lost.set())
        await listener.add_listener("saga_outbox", self._on_notify)
        self._wake.set()  # catch up on anything committed while it was away
        await lost.wait()

    async def _flush(self) -> int:
        """``flush_once``, retried with backoff until it works (the broker or the database is
        away); the backoff starts afresh after each success."""
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(Exception),
            wait=wait_exponential(multiplier=0.1, max=5.0),
            before_sleep=_say_retry,
        )
        async for attempt in retrying:
            with attempt:
                return await self.flush_once()
        raise AssertionError("unreachable: the relay retries for ever")

    async def _loop(self) -> None:
        while True:
            self._wake.clear()
            sent = await self._flush()
            if not self._leading:  # another relay publishes: ask again later, not per commit
                await asyncio.sleep(self.settings.relay_poll_s)
            elif sent < self.settings.relay_batch:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.settings.relay_poll_s)


def _say_retry(state: RetryCallState) -> None:
    """One line while the broker or the database is away; a traceback for anything else."""
    error = state.outcome.exception() if state.outcome is not None else None
    away = error is not None and (is_transient(error) or isinstance(error, AMQP_AWAY))
    wait = state.next_action.sleep if state.next_action is not None else 0.0
    log.warning("relay: %r; trying again in %.1fs", error, wait,
                exc_info=None if away or log_debug() else error)  # fmt: skip


def _message(row: asyncpg.Record) -> Outgoing:
    return to_amqp(
        row["body"],
        message_id=row["message_id"],
        message_type=row["message_type"],
        order_id=row["order_id"],
        headers=json.loads(row["headers"]),
    )
