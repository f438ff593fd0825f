"""Consuming one queue until cancelled, through the bus's connection: one delivery at a time in
queue order (``sequential``), several at once (``concurrent``), or in batches; a consumer the
broker dropped is subscribed again. What becomes of each delivery is decided in
``saga_shared.transport.delivery``."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from aio_pika.abc import AbstractChannel, AbstractIncomingMessage, AbstractQueue
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type

from saga_shared.observability import metrics
from saga_shared.observability.flow import FLOW
from saga_shared.transport.backoff import Backoff
from saga_shared.transport.delivery import (
    Acks,
    BatchHandler,
    Bury,
    FailureHook,
    Handler,
    InHand,
    Outcome,
    deliver,
    deliver_batch,
)
from saga_shared.transport.handoff import Taker, is_local
from saga_shared.transport.linger import NEVER, Linger

if TYPE_CHECKING:
    from saga_shared.transport.bus import Bus
    from saga_shared.transport.poison import Poison  # the server's: it needs asyncpg

log = logging.getLogger(__name__)

# A sequential consumer's key for handing several deliveries in at once: deliveries with
# distinct keys (orders) may be handled together; None: a delivery always handled alone.
Together = Callable[[AbstractIncomingMessage], str | None]


def _unsettled(future: asyncio.Future[object]) -> None:
    """A delivery in hand whose consumer was cancelled meanwhile (its channel closed) can fail
    to settle: nobody awaits it any more, so its error is taken here, in one line, instead of
    asyncio's "exception was never retrieved". The broker redelivers it."""
    if future.cancelled() or future.exception() is None:
        return
    log.warning("a delivery was not settled (%r); the broker redelivers it", future.exception())


@dataclass(frozen=True)
class _Batch:
    """Deliveries handled side by side: their keys, and the task that settles them."""

    keys: set[str | None]
    settled: asyncio.Future[object]


class ConsumerLost(Exception):
    """The broker cancelled our consumer; the supervisor subscribes again."""


async def consume(
    bus: Bus,
    queue_name: str,
    handler: Handler,
    *,
    prefetch: int,
    mode: Literal["sequential", "concurrent"],
    on_failure: FailureHook | None = None,
    batch: BatchHandler | None = None,
    max_batch: int = 32,
    together: Together | None = None,
    depth: int = 1,
    linger: Linger = NEVER,
    poison: Poison | None = None,
    also: Sequence[tuple[str, Handler]] = (),
) -> None:
    """Consume until cancelled. ``sequential`` handles one delivery at a time in queue order
    (aio-pika would otherwise run one task per delivery and lose the order).

    ``together`` (sequential mode): the deliveries waiting at the head of the queue whose keys
    differ (up to ``max_batch``, stopping at the first key seen already) are handled at once
    and settled in queue order, so a handler that groups work (the coordinator's group commit)
    gets them in one go. Up to ``depth`` such batches are in hand at once (the next one is
    handed in while the one before commits), never two deliveries of one key: a delivery
    whose key is in hand waits until that one is settled, its failure recorded, and so does
    every delivery behind it. Batches settle one after the other, in queue order.

    ``batch`` (concurrent mode only): the deliveries that arrive while a batch runs, or while
    the next waits for company (``linger``), go together into the next one (up to
    ``max_batch``), which ``batch`` handles in one go; what it hands back ``Alone`` runs on
    its own through ``handler``.

    ``also``: more queues, each with its handler, consumed on the same channel into the same
    arrival order, in-hand set and keys (a partition's outcome queue beside its quorum queue:
    one convoy).

    ``poison`` (concurrent mode only): the queue keeps no delivery limit and does no
    dead-lettering of its own (a classic queue); ``poison`` counts and buries instead.

    A watchdog notices when the broker cancels the consumer (its queue was deleted, a node
    failed over) and subscribes again, re-declaring the topology first: a consumer that the
    server dropped never silently stops the component."""

    def lost(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        metrics.CONSUMER_RESTARTS.labels(queue_name).inc()
        log.warning("consumer of %s lost (%r); subscribing again", queue_name, exc)

    if poison is not None:
        if mode != "concurrent":
            raise ValueError("a poison guard serves a concurrent consumer")
        if batch is not None:  # a batch's Alone deliveries were counted with their batch
            batch = poison.screen_batch(batch)
        else:
            handler = poison.screen(handler)
    # The series exists from the start, at 0: increase() then sees the first restart too.
    metrics.CONSUMER_RESTARTS.labels(queue_name)
    # A lost connection or channel surfaces in many types: every one means subscribe again.
    backoff = Backoff()
    resubscribing = AsyncRetrying(
        retry=retry_if_exception_type(Exception), wait=backoff, before_sleep=lost
    )
    async for attempt in resubscribing:
        with attempt:
            backoff.subscribing()
            if attempt.retry_state.attempt_number > 1:
                with contextlib.suppress(Exception):  # the broker may still be away
                    await bus.declare(requests=False)  # those are the coordinator's to find
            subscription = _Subscription(
                bus, queue_name, handler, prefetch, mode, on_failure, batch, linger,
                bury=poison.bury if poison is not None else None, also=also,
            )  # fmt: skip
            await subscription.run(together, max_batch, depth)
            raise ConsumerLost(f"the consumer of {queue_name} stopped")


class _Subscription:
    """One channel's consumer, until it is lost or cancelled."""

    def __init__(
        self,
        bus: Bus,
        queue_name: str,
        handler: Handler,
        prefetch: int,
        mode: Literal["sequential", "concurrent"],
        on_failure: FailureHook | None,
        batch: BatchHandler | None,
        linger: Linger = NEVER,
        bury: Bury | None = None,
        also: Sequence[tuple[str, Handler]] = (),
    ) -> None:
        self.bus = bus
        self.queue_name = queue_name
        self.handler = handler
        self.also = also
        self.handlers: dict[str, Handler] = {}  # consumer tag -> handler, for ``also``
        self.prefetch = prefetch
        self.mode = mode
        self.on_failure = on_failure
        self.inbox: asyncio.Queue[AbstractIncomingMessage] = asyncio.Queue()
        self.carried: list[AbstractIncomingMessage] = []  # taken, the head of the next batch
        self.to_settle = 0  # of the group being settled, after the one settling now
        self.flight: list[_Batch] = []  # the batches in hand (side by side), oldest first
        self.failed: BaseException | None = None
        self.in_hand: set[asyncio.Future[object]] = set()
        self.acks = Acks(self._waiting) if mode == "sequential" else None
        self.unsettled = InHand(bury)
        self.batch = batch
        self.linger = linger

    def handler_of(self, message: AbstractIncomingMessage) -> Handler:
        if not self.handlers:  # one queue
            return self.handler
        return self.handlers.get(message.consumer_tag or "", self.handler)

    def _waiting(self) -> bool:
        # A later batch in hand settles after this one: its ack can cover the held one.
        later = len(self.flight) > 1
        return self.to_settle > 0 or later or bool(self.carried) or not self.inbox.empty()

    def keep(self, future: asyncio.Future[object]) -> asyncio.Future[object]:
        # A delivery in hand runs to its ack even when the consumer is stopped: a graceful
        # stop finishes it instead of abandoning it half done.
        self.in_hand.add(future)
        future.add_done_callback(self.in_hand.discard)
        future.add_done_callback(_unsettled)
        return future

    def start(
        self, message: AbstractIncomingMessage, alone: Handler | None = None
    ) -> asyncio.Future[object]:
        settle_with = self.unsettled.settle if self.acks is None else self.acks.settle
        work = deliver(message, alone or self.handler_of(message), self.on_failure, settle_with)
        return self.keep(asyncio.ensure_future(work))

    async def on_message(self, message: AbstractIncomingMessage) -> None:
        FLOW.delivered(self.queue_name)
        if self.acks is None:
            self.unsettled.add(message)
        if self.mode == "sequential" or self.batch is not None:
            self.inbox.put_nowait(message)  # before any await: arrival order is kept
        else:
            await asyncio.shield(self.start(message))

    def take_here(self, message: AbstractIncomingMessage) -> None:
        """A delivery handed over in this process (``saga_shared.transport.handoff``): into the
        same arrival order as the broker's, never counted among the channel's unsettled."""
        FLOW.delivered(self.queue_name)
        if self.mode == "sequential" or self.batch is not None:
            self.inbox.put_nowait(message)
        else:
            self.start(message)

    async def one_by_one(self) -> None:
        while True:
            await asyncio.shield(self.start(await self.inbox.get()))

    async def batches(self, handle: BatchHandler, most: int) -> None:
        last = 0
        while True:
            # Taken but not started, like those still in the inbox: a stop meanwhile closes the
            # channel, and the broker hands it out again; one handed over here is in
            # ``carried`` for the stop to send the broker's way.
            taken = self.carried = [await self.inbox.get()]
            wait = self.linger.wait(last, self.inbox.qsize() + 1, most)
            if wait:
                await asyncio.sleep(wait)
            while not self.inbox.empty() and len(taken) < most:
                taken.append(self.inbox.get_nowait())
            self.carried, last = [], len(taken)
            done = deliver_batch(taken, handle, self.unsettled, self.start, self.on_failure)
            await asyncio.shield(self.keep(asyncio.ensure_future(done)))

    async def side_by_side(self, key: Together, most: int, depth: int) -> None:
        while True:
            if self.failed is not None:
                raise self.failed  # a settle failed: the channel is gone, subscribe again
            if not self.carried:  # held there while it waits, so acks know more is coming
                self.carried.append(await self.inbox.get())
            await self._until_free(key(self.carried[-1]), depth)
            first = self.carried.pop()
            taken, seen, flying = [first], {key(first)}, self.flying_keys
            while None not in seen and not self.inbox.empty() and len(taken) < most:
                message = self.inbox.get_nowait()
                k = key(message)
                if k is None or k in seen or k in flying:
                    self.carried.append(message)
                    break
                seen.add(k)
                taken.append(message)
            self._start_batch(taken, seen)

    @property
    def flying_keys(self) -> set[str | None]:
        return {k for batch in self.flight for k in batch.keys}

    async def _until_free(self, k: str | None, depth: int) -> None:
        """Wait (for the oldest batch in hand to settle) until a batch led by key ``k`` may
        start: fewer than ``depth`` in hand, none of them holding ``k`` (None: none at all)."""
        while self.flight:
            flying = self.flying_keys
            if len(self.flight) < depth and k is not None and not {k, None} & flying:
                return
            await asyncio.wait({self.flight[0].settled})

    def _start_batch(self, taken: list[AbstractIncomingMessage], keys: set[str | None]) -> None:
        before = self.flight[-1].settled if self.flight else None
        batch = _Batch(keys, self.keep(asyncio.ensure_future(self._together(taken, before))))
        self.flight.append(batch)
        batch.settled.add_done_callback(functools.partial(self._landed, batch))

    def _landed(self, batch: _Batch, settled: asyncio.Future[object]) -> None:
        self.flight.remove(batch)
        if not settled.cancelled() and settled.exception() is not None:
            self.failed = settled.exception()

    async def _together(
        self, taken: list[AbstractIncomingMessage], before: asyncio.Future[object] | None
    ) -> None:
        """Handle at once, then settle in queue order, after the batch ``before`` (each failure
        recorded before any settles)."""
        assert self.acks is not None
        outcomes: dict[int, Outcome] = {}

        async def hold(message: AbstractIncomingMessage, outcome: Outcome) -> None:
            outcomes[id(message)] = outcome

        if len(taken) == 1:  # the common case when idle: no task of its own, no turn of the loop
            await deliver(taken[0], self.handler_of(taken[0]), self.on_failure, hold)
        else:
            await asyncio.gather(
                *(deliver(m, self.handler_of(m), self.on_failure, hold) for m in taken)
            )
        if before is not None:
            await asyncio.wait({before})  # its failure, if any, is its own
        for i, message in enumerate(taken):
            self.to_settle = len(taken) - i - 1
            await self.acks.settle(message, outcomes[id(message)])

    async def run(self, together: Together | None, most: int, depth: int = 1) -> None:
        channel = await self.bus.connection.channel()
        await channel.set_qos(prefetch_count=self.prefetch)
        worker = None
        if self.batch is not None:
            worker = asyncio.create_task(self.batches(self.batch, most))
        elif self.mode == "sequential" and together is not None:
            worker = asyncio.create_task(self.side_by_side(together, most, depth))
        elif self.mode == "sequential":
            worker = asyncio.create_task(self.one_by_one())
        tags: dict[str, AbstractQueue] = {}
        takers: list[Taker] = []
        try:
            for name, handler in ((self.queue_name, None), *self.also):
                queue = await channel.get_queue(name, ensure=False)
                tag = await queue.consume(self.on_message)
                tags[tag] = queue
                if handler is not None:
                    self.handlers[tag] = handler
                handoff = self.bus.handoff
                taker = handoff.attach(name, tag, self.take_here) if handoff else None
                if taker is not None:
                    takers.append(taker)
            await self._watch(channel, tags, worker)
        finally:
            await self._wind_down(channel, tags, worker, takers)

    async def _watch(
        self,
        channel: AbstractChannel,
        tags: dict[str, AbstractQueue],
        worker: asyncio.Task[None] | None,
    ) -> None:
        """Raise once the broker has cancelled a consumer of ``channel`` or the worker failed.
        The broker's cancel (its queue deleted, its node gone) wakes this at once; the look
        every ``watchdog_s`` stays for what says nothing (a channel closed with its
        connection)."""
        cancelled = asyncio.Event()
        heard: object = None  # the channel under ours that tells ``cancelled``
        underlay = await channel.get_underlay_channel()
        while True:
            if underlay is not heard:  # the first, or aio-pika restored ours on a new one
                on_cancel = getattr(underlay, "on_consumer_cancel_callbacks", None)
                if on_cancel is not None:
                    on_cancel.add(lambda _frame: cancelled.set())
                heard = underlay
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(cancelled.wait(), self.bus.settings.watchdog_s)
            cancelled.clear()
            underlay = await channel.get_underlay_channel()
            consumers = getattr(underlay, "consumers", None)
            for tag, queue in tags.items():
                if consumers is not None and tag not in consumers:
                    raise ConsumerLost(f"the broker cancelled the consumer of {queue.name}")
            if worker is not None and worker.done():
                worker.result()

    async def _wind_down(
        self,
        channel: AbstractChannel,
        tags: dict[str, AbstractQueue],
        worker: asyncio.Task[None] | None,
        takers: Sequence[Taker],
    ) -> None:
        """Stop taking deliveries, let the ones in hand finish (bounded), send the acks held
        back, then close: whatever was prefetched but not started goes back to the queue, in
        order, and what was handed over here but not started goes the broker's way."""
        for taker in takers:
            taker.close()
        for tag, queue in tags.items():
            if not channel.is_closed:
                with contextlib.suppress(Exception):
                    await queue.cancel(tag)
        if worker is not None:
            worker.cancel()
            await asyncio.gather(worker, return_exceptions=True)
        await self._hand_back()
        if self.in_hand:
            await asyncio.wait(set(self.in_hand), timeout=self.bus.settings.stop_grace_s)
        if self.acks is not None and not channel.is_closed:
            with contextlib.suppress(Exception):
                await self.acks.flush()
        if not channel.is_closed:
            with contextlib.suppress(Exception):
                await channel.close()

    async def _hand_back(self) -> None:
        """The deliveries handed over here and not started: the broker's way (their queue's
        rules then apply); the broker's own go back when the channel closes."""
        waiting = [*self.carried, *(self.inbox.get_nowait() for _ in range(self.inbox.qsize()))]
        self.carried = []
        # At once, in their order on the channel: each waits for its confirm, and one timeout
        # bounds them all while the broker is away.
        await asyncio.gather(*(m.reject(requeue=True) for m in waiting if is_local(m)))
