"""Delivery limits and dead letters for the queues the broker keeps neither for: the classic
request queues (``saga_shared.transport.topology``). A quorum queue counts deliveries
(``x-delivery-limit``) and dead-letters at least once; a classic queue does neither, and its
dead-lettering is at most once. So its consumer does both:

- **Counting.** A first delivery (``redelivered`` false: never handed out before) costs nothing.
  A redelivery is counted durably (``delivery_counts``, one statement for a batch) before it is
  handled, so a message that kills its process is counted too. Once handled
  ``delivery_limit + 1`` times (what a quorum queue allows) it is not handled again.
- **Burying.** A message past its limit, or refused at once (invalid, forged), is published to
  the dead-letter exchange with a confirm, and only then acked: a crash in between publishes
  it twice, which the ingester's row for its id absorbs. The copy says where it died and why
  (``DEAD_HEADER``) and who sent it: the copy is published by this consumer, so the broker
  stamps this consumer's user on it, and the ingester believes the named sender only from the
  service that owns the queue (``saga_coordinator.dead_letters``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

import asyncpg
from aio_pika.abc import AbstractIncomingMessage

from saga_shared.errors import DeliveryLimitReached
from saga_shared.model.text import header_text
from saga_shared.storage.sql import Queries
from saga_shared.transport.codec import Outgoing, copy_of
from saga_shared.transport.delivery import BatchHandler, BatchVerdict, Handler

Q = Queries(Path(__file__).with_name("poison.sql"))
DEAD_HEADER = "x-saga-dead"  # reason, queue, exchange, routing key, count, time, sender


class Counter(Protocol):
    async def count(self, queue: str, message_ids: Sequence[str]) -> list[int]:
        """Each message's deliveries so far, this one included (at least 2: it is a
        redelivery), durably counted."""


class Publish(Protocol):
    async def __call__(self, exchange: str, routing_key: str, message: Outgoing) -> None: ...


class PgCounter:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    async def count(self, queue: str, message_ids: Sequence[str]) -> list[int]:
        rows = await self.pool.fetch(Q.delivery_count, queue, list(message_ids))
        counts = {row["message_id"]: row["deliveries"] for row in rows}
        return [counts[m] for m in message_ids]


class MemoryCounter:
    """The twin (the simulation, unit tests)."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str], int] = {}

    async def count(self, queue: str, message_ids: Sequence[str]) -> list[int]:
        out = []
        for message_id in message_ids:
            n = self.counts[queue, message_id] = max(self.counts.get((queue, message_id), 1), 1) + 1
            out.append(n)
        return out


def _id(message: AbstractIncomingMessage) -> str:
    # A message without an id cannot be counted across deliveries: its delivery tag stands in,
    # and such a message is refused as invalid anyway (every message of ours has an id).
    return header_text(message.message_id, 128) or f"(no id, tag {message.delivery_tag})"


class Poison:
    """One classic queue's delivery limit and burial. ``publish`` publishes with a confirm,
    mandatory (the dead-letter exchange must reach its queue)."""

    def __init__(
        self, queue: str, limit: int, counter: Counter, publish: Publish, dead_letters: str,
        sender: Callable[[AbstractIncomingMessage], str | None] = lambda m: m.user_id,
    ) -> None:  # fmt: skip
        self.queue = queue
        self.limit = limit
        self.counter = counter
        self.publish = publish
        self.dead_letters = dead_letters
        self.sender = sender
        # id(message) -> the message and its count, for the burial's reason. The message is
        # held so its id stays its own: an entry left by a burial that never came (a stop)
        # cannot name another message's count.
        self._over: dict[int, tuple[AbstractIncomingMessage, int]] = {}

    async def over_limit(
        self, messages: Sequence[AbstractIncomingMessage]
    ) -> list[DeliveryLimitReached | None]:
        """Count the redeliveries among ``messages``; an error for each past the limit."""
        again = [m for m in messages if m.redelivered]
        counts = dict(zip(map(id, again), await self.counter.count(
            self.queue, [_id(m) for m in again]), strict=True)) if again else {}  # fmt: skip
        out: list[DeliveryLimitReached | None] = []
        for message in messages:
            # Handled ``limit + 1`` times at most, as a quorum queue's x-delivery-limit allows
            # (it dead-letters once a return makes the count exceed the limit).
            handled = counts.get(id(message), 1) - 1
            if handled > self.limit:
                self._over[id(message)] = (message, handled)
                out.append(DeliveryLimitReached(handled, self.limit))
            else:
                out.append(None)
        return out

    def screen(self, handler: Handler) -> Handler:
        """``handler``, for deliveries counted first (a concurrent consumer's)."""

        async def screened(message: AbstractIncomingMessage) -> None:
            [over] = await self.over_limit([message])
            if over is not None:
                raise over
            await handler(message)

        return screened

    def screen_batch(self, handler: BatchHandler) -> BatchHandler:
        """``handler``, for batches counted first; what is past its limit is not handed in."""

        async def screened(messages: Sequence[AbstractIncomingMessage]) -> list[BatchVerdict]:
            verdicts: list[BatchVerdict] = list(await self.over_limit(messages))
            rest = [i for i, v in enumerate(verdicts) if v is None]
            if rest:
                for i, verdict in zip(rest, await handler([messages[i] for i in rest]),
                                      strict=True):  # fmt: skip
                    verdicts[i] = verdict
            return verdicts

        return screened

    async def bury(self, message: AbstractIncomingMessage) -> None:
        """Publish ``message`` to the dead letters with a confirm (its ack follows)."""
        _, count = self._over.pop(id(message), (message, None))
        dead = {
            "reason": "delivery_limit" if count is not None else "rejected",
            "queue": self.queue,
            "exchange": message.exchange or "",
            "routing-key": message.routing_key or "",
            "count": count or 1,
            "time": datetime.now(UTC).replace(microsecond=0),
            "sender": self.sender(message) or "",
        }
        await self.publish(self.dead_letters, "", copy_of(message, {DEAD_HEADER: dead}))
