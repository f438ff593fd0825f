"""Group commit: the messages that the partitions hand in while a transaction runs go together
in the next one, and so do those handed in at the same moment. A partition hands in the
messages waiting at its head as long as their orders differ, and waits for their outcomes
before the next ones; one transaction never holds two messages of one order (the later waits
for the next transaction, and fails if the earlier did, so it never overtakes it). So order
within an order is untouched, and messages of many orders share a transaction, its round trips
and its fsync.

There is no batching task: the first caller that finds no transaction running leads the next
one (its delivery is in hand, so a graceful stop lets it finish); the others wait for their
outcome. A batch that fails for a reason other than the database being away is split, each
message alone, so one bad message cannot fail its neighbours' deliveries."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime

from saga_shared.errors import RetryLater
from saga_shared.model.messages import PartitionMessage
from saga_shared.observability import metrics
from saga_shared.transport.linger import NEVER, Linger

log = logging.getLogger(__name__)

# Runs one transaction for the messages given and returns a note per message, in order.
Apply = Callable[[Sequence[PartitionMessage], datetime], Awaitable[list[str]]]
# Returns when the next transaction may run (what the last ones committed has gone out).
Ready = Callable[[], Awaitable[None]]


class GroupCommit:
    def __init__(
        self, apply: Apply, max_batch: int, ready: Ready | None = None, linger: Linger = NEVER
    ) -> None:
        self._apply = apply
        self._max = max_batch
        self._ready = ready
        self._linger = linger
        self._last = 0  # how many messages the last transaction took
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
                # One turn of the loop first: the messages handed in together (a partition's
                # batch, see ``Coordinator._consume``) join this transaction.
                await asyncio.sleep(0)
                wait = self._linger.wait(self._last, len(self._waiting), self._max)
                if wait:
                    await asyncio.sleep(wait)  # under load: more messages join this one
                if self._ready is not None:
                    await self._ready()  # meanwhile the messages handed in wait to join
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
        self._last = len(batch)  # as taken: a failed batch split into ones is still a sign of load
        await self._apply_batch(batch)
        failed = {m.order_id for m, outcome in batch if outcome.exception() is not None}
        if failed:
            self._fail_behind(failed)

    def _fail_behind(self, orders: set[str]) -> None:
        """A message waiting behind one of its order's that failed must not overtake it (the
        failure blocks the order once it is recorded, which is after this): it fails too."""
        behind = [item for item in self._waiting if item[0].order_id in orders]
        self._waiting = [item for item in self._waiting if item[0].order_id not in orders]
        for message, outcome in behind:
            outcome.set_exception(
                RetryLater(f"an earlier message of order {message.order_id} failed")
            )

    async def _apply_batch(self, batch: list[tuple[PartitionMessage, asyncio.Future[str]]]) -> None:
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
                await self._apply_batch([item])
            return
        for (_, outcome), note in zip(batch, notes, strict=True):
            outcome.set_result(note)
