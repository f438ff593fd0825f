"""Group commit: the messages that the partitions hand in while a transaction runs go together
in the next one. Each partition still hands in one message at a time and waits for its
outcome, so order within a partition is untouched; messages of different partitions (hence of
different orders) share a transaction, its round trips and its fsync.

There is no batching task: the first caller that finds no transaction running leads the next
one (its delivery is in hand, so a graceful stop lets it finish); the others wait for their
outcome. A batch that fails for a reason other than the database being away is split, each
message alone, so one bad message cannot fail its neighbours' deliveries."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime

from shared import metrics
from shared.errors import RetryLater
from shared.messages import PartitionMessage

log = logging.getLogger(__name__)

# Runs one transaction for the messages given and returns a note per message, in order.
Apply = Callable[[Sequence[PartitionMessage], datetime], Awaitable[list[str]]]


class GroupCommit:
    def __init__(self, apply: Apply, max_batch: int) -> None:
        self._apply = apply
        self._max = max_batch
        self._waiting: list[tuple[PartitionMessage, asyncio.Future[str]]] = []
        self._ended: asyncio.Event | None = None  # set when the running transaction ends

    async def submit(self, message: PartitionMessage) -> str:
        """Apply ``message`` in a transaction, maybe with others; returns its note."""
        outcome: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._waiting.append((message, outcome))
        while not outcome.done():
            if self._ended is not None:
                await self._ended.wait()
                continue
            self._ended = ended = asyncio.Event()
            try:
                await self._run(self._take())
            finally:
                self._ended = None
                ended.set()
        return outcome.result()

    def _take(self) -> list[tuple[PartitionMessage, asyncio.Future[str]]]:
        """Up to ``max_batch`` waiting messages, one per order (a later message of an order
        waits for the next transaction: one transaction cannot lock an order twice)."""
        batch: list[tuple[PartitionMessage, asyncio.Future[str]]] = []
        orders: set[str] = set()
        rest = []
        for item in self._waiting:
            if len(batch) < self._max and item[0].order_id not in orders:
                orders.add(item[0].order_id)
                batch.append(item)
            else:
                rest.append(item)
        self._waiting = rest
        return batch

    async def _run(self, batch: list[tuple[PartitionMessage, asyncio.Future[str]]]) -> None:
        now = datetime.now(UTC)
        metrics.BATCH_SIZE.observe(len(batch))
        try:
            notes = await self._apply([m for m, _ in batch], now)
        except RetryLater as exc:  # the database is away: every message goes back alike
            for _, outcome in batch:
                outcome.set_exception(exc)
            return
        except Exception as exc:
            if len(batch) == 1:
                batch[0][1].set_exception(exc)
                return
            log.warning("a batch of %d failed (%r): each message alone now", len(batch), exc)
            for item in batch:
                await self._run([item])
            return
        for (_, outcome), note in zip(batch, notes, strict=True):
            outcome.set_result(note)
