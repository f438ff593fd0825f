"""The failure hook every consumer passes to the bus: record the error, block the order."""

from __future__ import annotations

import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path

import asyncpg
from aio_pika.abc import AbstractIncomingMessage

from saga_shared.errors import DeliveryLimitReached, InvalidMessage, RetryLater
from saga_shared.model.text import clean
from saga_shared.storage.sql import Queries, holding
from saga_shared.transport.codec import identify_incoming
from saga_shared.transport.delivery import FailureHook, Outcome

Q = Queries(Path(__file__).with_name("failures.sql"))


# The id an order's block is kept under, for a delivery whose convoy id is not its body's own
# (a client's command routed straight to its partition); None: the body's.
BlockKey = Callable[[AbstractIncomingMessage], Awaitable[str | None]]


def failure_recorder(
    pool: asyncpg.Pool, queue: str, *,
    block_order: bool | Callable[[AbstractIncomingMessage], bool],
    key: BlockKey | None = None, hold_s: float = 600.0,
) -> FailureHook:  # fmt: skip
    """Each failed attempt is stored with its error, so the dead letter can say why. Consumers
    of an order's convoy (partitions) also block the order at the first failure of a message that
    will be retried: with a prefetch above one, later messages of the order are already in hand
    and would otherwise be handled before the failed one comes back. A message refused at once
    (invalid, forged) blocks nothing: only a valid message a handler failed on may hold its
    order. A block is never skipped because the database is away (requeued without it, the
    message would be overtaken by the next of its order, as the simulation found when a bug and
    an outage met): its write is retried, holding the delivery, for up to ``hold_s``. A failure
    that blocks nothing is recorded in one attempt: the message is retried anyway.
    ``block_order`` may decide per message (``Topology.failure_holds_its_order``)."""

    async def on_failure(
        message: AbstractIncomingMessage, error: BaseException, outcome: Outcome
    ) -> None:
        if isinstance(error, DeliveryLimitReached):
            return  # not a try of its own: the dead letter says why the last try failed
        ident = identify_incoming(message)
        text = clean(f"{type(error).__name__}: {error}", 2000)
        blocks = (outcome is Outcome.RETRY and ident.order_id is not None
                  and (block_order(message) if callable(block_order) else block_order))  # fmt: skip
        # Found before a connection is held: finding it may read the store itself.
        held_by = (await key(message) if key and blocks else None) or ident.message_id
        detail = (
            text if isinstance(error, InvalidMessage | RetryLater) else _with_trace(text, error)
        )

        async def record() -> None:
            async with pool.acquire() as conn, conn.transaction():
                await conn.execute(
                    Q.failure_upsert, ident.message_id, ident.order_id, queue, detail
                )
                if blocks:
                    await conn.execute(Q.block_upsert, ident.order_id, held_by, "retrying", text)

        if not blocks:
            await record()
            return
        async for attempt in holding(hold_s):
            with attempt:
                await record()

    return on_failure


def _with_trace(text: str, error: BaseException) -> str:
    """The error and where it came from: kept with the failure, shown with the dead letter
    (the log of a retried delivery has one line; this is where the traceback goes)."""
    lines = traceback.format_exception(error)
    kept = lines if len(lines) <= 8 else [lines[0], "  ...\n", *lines[-7:]]  # the innermost
    return clean(text + "\n" + "".join(kept).rstrip(), 4000)
