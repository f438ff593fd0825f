"""A coordinator process in the simulation: the product's own gatekeeper, processor, dead-letter
judge and delivery rules (``saga_shared.transport.delivery``) over the simulated broker and the
in-memory store (``saga_app.sim.store``), as ``saga_coordinator.coordinator`` runs them over
RabbitMQ and Postgres. What differs is only the I/O: each partition's deliveries are handled one at
a time in arrival order with a prefetch above one (so a message that fails has later ones of its
order in hand, as the real consumer has), the outbox rows of a transaction are published right after
its commit and deleted once confirmed, a relay republishes rows left behind, a timer fires
deadlines, and dead letters are judged, stored and block their orders."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, cast

from aio_pika.abc import AbstractIncomingMessage

from saga_app.sim.bus import SimBus
from saga_app.sim.errors import ChannelGone, NotFound, Unroutable
from saga_app.sim.messages import FakeDelivery
from saga_coordinator.coordinator import handle_or_move
from saga_coordinator.dead_letters import DeadLetterIngester, applied_elsewhere, read_death
from saga_coordinator.gatekeeper import Gatekeeper, stamped
from saga_coordinator.memory import MemoryTx
from saga_coordinator.processor import Processor
from saga_coordinator.rows import OutboxRow
from saga_coordinator.store import Store
from saga_shared.errors import InvalidMessage
from saga_shared.model.messages import DeskCommand, PartitionMessage, QuerySaga
from saga_shared.security import trust
from saga_shared.security.trust import Forged
from saga_shared.transport.bus import Bus
from saga_shared.transport.codec import (
    PARTITION,
    Outgoing,
    check_order_header,
    decode_incoming,
    identify_incoming,
)
from saga_shared.transport.delivery import Outcome, deliver
from saga_shared.transport.topology import partition_of

if TYPE_CHECKING:
    from saga_app.sim.world import World

PREFETCH = 8
RELAY_POLL_S, RELAY_STALE_S, DEADLINE_POLL_S, WATCHDOG_S = 1.0, 3.0, 0.25, 2.0


class CoordinatorProcess:
    def __init__(self, world: World, index: int) -> None:
        self.world = world
        self.index = index
        self.name = f"coordinator-{index}"
        self.tasks: list[asyncio.Task[None]] = []
        self.alive = False

    def start(self) -> None:
        w = self.world
        self.connection = w.broker.connect(user=w.users.coordinator, name=self.name)
        self.bus = SimBus(self.connection, w.topology, w.settings)
        w.broker.declare()  # the coordinator owns the topology: what is missing comes back
        self.processor = Processor(w.catalog, w.topology)
        self.gate = Gatekeeper(w.settings, w.catalog, cast(Bus, self.bus),
                               cast(Store, w.records))  # fmt: skip
        self.judge = DeadLetterIngester(w.settings, cast(Bus, self.bus), cast(Store, None))
        self.alive = True
        self.outcome_tags: set[str] = set()
        for p in range(w.settings.partitions):
            inbox: asyncio.Queue[FakeDelivery] = asyncio.Queue()
            self.connection.consume(w.topology.partition_queue(p), inbox.put, prefetch=PREFETCH)
            self._spawn(self._partition(p, inbox))
            self._spawn(self._outcomes(p, inbox))
        letters: asyncio.Queue[FakeDelivery] = asyncio.Queue()
        self.connection.consume(w.topology.dead_letter_queue, letters.put, prefetch=1)
        self._spawn(self._dead_letters(letters))
        self._spawn(self._timer())
        self._spawn(self._relay())
        self._spawn(self._watch())
        w.note(self.name, "started")

    def _spawn(self, work: Any) -> None:
        self.tasks.append(asyncio.ensure_future(work))

    def stop(self, why: str) -> None:
        """A crash (or a stop: the broker sees the same): what it held goes back."""
        if not self.alive:
            return
        self.alive = False
        for task in self.tasks:
            task.cancel()
        self.tasks = []
        self.connection.close(why)
        self.world.note(self.name, why)

    # --- the partitions ---------------------------------------------------------------------

    async def _partition(self, p: int, inbox: asyncio.Queue[FakeDelivery]) -> None:
        handle = functools.partial(self.handle, partition=p)
        outcome = functools.partial(self._outcome, partition=p)
        while True:
            delivery = await inbox.get()
            if delivery.consumer_tag not in self.outcome_tags:
                await deliver(delivery, handle, on_failure=self._on_failure)
                continue
            # Its queue deleted meanwhile, the delivery has nothing to settle with any more.
            with contextlib.suppress(ChannelGone):
                await deliver(delivery, outcome, on_failure=self._on_failure)

    async def _outcomes(self, p: int, inbox: asyncio.Queue[FakeDelivery]) -> None:
        """The partition's outcome queue, into the partition's one convoy; subscribed again
        when the broker cancels it (its queue gone) or it is not there yet."""
        while True:
            try:
                consumer = self.connection.consume(
                    self.world.topology.outcome_queue(p), inbox.put, prefetch=PREFETCH
                )
            except NotFound:
                await asyncio.sleep(WATCHDOG_S)
                continue
            self.outcome_tags.add(consumer.tag)
            while not consumer.closed:  # noqa: ASYNC110 (polled, as the real watchdog polls)
                await asyncio.sleep(WATCHDOG_S)

    async def _outcome(self, delivery: AbstractIncomingMessage, *, partition: int) -> None:
        """``Coordinator._outcome``: the product's rule (``handle_or_move``) over this broker."""
        exchange = self.world.topology.partitions_exchange

        async def move(copy: Outgoing) -> None:
            await self.bus.publish_raw(exchange, str(partition), copy)
            self.world.note(self.name, f"outcome {delivery.message_id} moved")

        await handle_or_move(delivery, functools.partial(self.handle, partition=partition), move)

    async def handle(self, delivery: AbstractIncomingMessage, *, partition: int) -> None:
        w = self.world
        if delivery.exchange == w.topology.commands_exchange:
            examined = await self.gate.examine(delivery, partition=partition)
            if examined is None:
                return  # refused: recorded and answered
            command, plan = examined
            if isinstance(command, QuerySaga):
                await self.gate.answer(command)
                return
            assert not isinstance(command, DeskCommand)
            message: PartitionMessage = stamped(command)
            if plan is not None:
                self.processor.plans[id(message)] = plan
        else:
            message = decode_incoming(delivery, PARTITION, w.settings.max_message_bytes)
            check_order_header(delivery, message.order_id)
            if partition_of(message.order_id, w.settings.partitions) != partition:
                raise InvalidMessage(f"order {message.order_id} is not routed to {partition}")
            sender = trust.first_sender(w.directory, delivery.user_id, delivery.headers)
            trust.partition_message(w.directory, message, sender)
        try:
            w.sabotage(message)  # an injected bug: this message fails for a while
            await self._apply([message])
        finally:
            self.processor.plans.pop(id(message), None)

    async def _apply(self, messages: Sequence[PartitionMessage]) -> None:
        w = self.world
        now = w.now()
        notes, sent = await w.store.run_held(
            lambda tx: self.processor.handle_batch(tx, messages, now)
        )
        for message, note in zip(messages, notes, strict=True):
            w.handled(self.name, message, note)
        await w.crash_point(self, "coordinator.after_commit")
        await self._publish(sent)
        await w.crash_point(self, "coordinator.after_publish")

    async def _on_failure(
        self, delivery: AbstractIncomingMessage, error: BaseException, outcome: Outcome
    ) -> None:
        """``saga_shared.transport.failures.failure_recorder``'s rule: a valid message that failed
        and will
        be retried blocks its order, so later ones in hand wait behind it; with the database
        away the block's write is held and retried, never skipped."""
        ident = identify_incoming(delivery)
        self.world.note(self.name, f"{ident.message_type} {ident.message_id} failed: "
                        f"{type(error).__name__}: {error} -> {outcome.value}")  # fmt: skip
        if outcome is not Outcome.RETRY or ident.order_id is None:
            return
        if not self.world.topology.failure_holds_its_order(delivery.exchange):
            return
        key = await self._block_key(delivery) or ident.message_id
        order, text = ident.order_id, f"{type(error).__name__}: {error}"
        await self.world.store.run_held(lambda tx: tx.block(order, key, "retrying", text))

    async def _block_key(self, delivery: AbstractIncomingMessage) -> str | None:
        if delivery.exchange != self.world.topology.commands_exchange:
            return None
        ident = identify_incoming(delivery)
        try:
            sender = await self.gate.sender(delivery, ident)
        except Forged:
            return None
        return trust.forwarded_id(sender or "", ident.message_id)

    # --- publishing what committed ------------------------------------------------------------

    async def _publish(self, sent: Sequence[tuple[int, OutboxRow]]) -> None:
        """The rows of a commit, in order; each deleted once confirmed. One the broker did not
        confirm stays for the relay."""
        if not sent:
            return
        items = [(row.exchange, row.routing_key, row.amqp()) for _, row in sent]
        errors = await self.bus.publish_many(items)
        topology = self.world.topology
        lost = [i for i, ((_, row), error) in enumerate(zip(sent, errors, strict=True))
                if isinstance(error, Unroutable)
                and topology.is_request_route(row.exchange, row.routing_key)]  # fmt: skip
        if lost:  # as saga_coordinator.sender: the request queue is declared again, sent again
            await self._recover({sent[i][1].routing_key.removeprefix("request.") for i in lost})
            again = await self.bus.publish_many([items[i] for i in lost])
            for i, error in zip(lost, again, strict=True):
                errors[i] = error
        done = [i for (i, _), error in zip(sent, errors, strict=True) if error is None]
        self.world.store.forget(done)

    async def _recover(self, services: set[str], partitions: set[int] | None = None) -> None:
        """``saga_coordinator.queue_watch.QueueWatch.recover`` (and ``resume``, for outcome
        queues): the queues declared again, and each request that was out to ``services`` (of
        the orders in ``partitions``: all when None) handed a lost-marked deadline."""
        w = self.world
        await self.bus.declare()
        t = w.topology

        async def resend(tx: MemoryTx) -> None:
            tx.outbox([OutboxRow.of(t.partitions_exchange, t.partition_key(m.order_id), m)
                       for m in tx.requests_out(services)
                       if partitions is None
                       or partition_of(m.order_id, t.partitions) in partitions])  # fmt: skip

        _, sent = await w.store.run_held(resend)
        what = f"partitions {sorted(partitions)}" if partitions is not None else sorted(services)
        w.note(self.name, f"queues of {what} gone: {len(sent)} sent again")
        await self._publish(sent)

    async def _watch(self) -> None:
        """``QueueWatch.run``: every request and outcome queue looked for, every watchdog
        period."""
        w, t = self.world, self.world.topology
        queues = {t.request_queue(s): s for s in t.services}
        outcomes = {t.outcome_queue(p): p for p in range(t.partitions)}
        while True:
            await asyncio.sleep(WATCHDOG_S)
            if not w.broker.up or w.store.down():
                continue
            gone = {s for q, s in queues.items() if q not in w.broker.queues}
            if gone:
                await self._recover(gone)
            lost = {p for q, p in outcomes.items() if q not in w.broker.queues}
            if lost:
                await self._recover(set(t.services), lost)

    async def _relay(self) -> None:
        """Rows nobody published (a crash between commit and publish, a broker away): the
        first live coordinator publishes them, in id order."""
        w = self.world
        while True:
            await asyncio.sleep(RELAY_POLL_S)
            if w.first_coordinator() is self:
                await self._publish(w.store.stale(RELAY_STALE_S))

    async def _timer(self) -> None:
        w = self.world
        while True:
            await asyncio.sleep(DEADLINE_POLL_S)
            if w.first_coordinator() is not self or w.store.down():
                continue
            _, sent = await w.store.run_held(self._fire)
            await self._publish(sent)

    async def _fire(self, tx: MemoryTx) -> None:
        topology = self.world.topology
        for message in tx.fire_due(self.world.now()):
            key = topology.partition_key(message.order_id)
            tx.outbox([OutboxRow.of(topology.partitions_exchange, key, message)])

    # --- dead letters -------------------------------------------------------------------------

    async def _dead_letters(self, letters: asyncio.Queue[FakeDelivery]) -> None:
        while True:
            delivery = await letters.get()
            await deliver(delivery, self._bury)

    async def _bury(self, delivery: AbstractIncomingMessage) -> None:
        """Judged as the product's ingester judges it; stored; a valid message from its
        rightful sender blocks its order until an operator replays it."""
        w = self.world
        ident = identify_incoming(delivery)
        death = read_death(dict(delivery.headers or {}), w.now())
        box: list[Any] = []

        async def judge(tx: MemoryTx) -> None:
            sender = self.judge.sender_of(delivery, death)
            judged = await self.judge.judge(cast(Any, tx), delivery, ident, death, sender)
            if await applied_elsewhere(cast(Any, tx), judged, self.processor.release, w.now()):
                judged = replace(judged, blocks=False)
            box.append(judged)
            if judged.blocks and judged.order_id and judged.block_key:
                await tx.block(judged.order_id, judged.block_key, "dead", judged.reason)

        await w.store.run_held(judge)
        w.bury(delivery, death, box[0])
