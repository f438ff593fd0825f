"""The coordinator: consumes the partitions it owns (``saga_coordinator.ownership``), one message
at a time per partition, and applies them through the ``Processor``, the messages of different
partitions that arrive together in one transaction (``GroupCommit``). A partition is two queues
in one convoy: its quorum queue (commands, deadlines, settles' answers) and its classic outcome
queue, whose outcomes a failure moves to the quorum queue (``_outcome``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime

from aio_pika.abc import AbstractIncomingMessage

from saga_coordinator.gatekeeper import Gatekeeper, stamped
from saga_coordinator.group_commit import GroupCommit
from saga_coordinator.ownership import Ownership
from saga_coordinator.processor import Processor
from saga_coordinator.queue_watch import QueueWatch
from saga_coordinator.sender import Sender
from saga_coordinator.store import Store
from saga_shared.config import Settings
from saga_shared.crashpoints import crash_point
from saga_shared.errors import InvalidMessage, RetryLater
from saga_shared.model.catalog import Catalog
from saga_shared.model.gateway import AdmittedPlan
from saga_shared.model.messages import DeskCommand, PartitionMessage, QuerySaga
from saga_shared.observability import tracing
from saga_shared.security import trust
from saga_shared.security.identity import Directory, database_url_for
from saga_shared.security.trust import MOVED_HEADER, REPLAY_HEADER, Forged
from saga_shared.transport.bus import Bus
from saga_shared.transport.codec import (
    PARTITION,
    Outgoing,
    check_order_header,
    copy_of,
    decode_incoming,
    identify_incoming,
    order_header,
)
from saga_shared.transport.failures import failure_recorder
from saga_shared.transport.linger import Linger
from saga_shared.transport.topology import partition_of

log = logging.getLogger(__name__)


class Coordinator:
    def __init__(self, settings: Settings, catalog: Catalog, bus: Bus, store: Store) -> None:
        self.settings = settings
        self.bus = bus
        self.store = store
        self.processor = Processor(catalog, bus.topology)
        self.directory = Directory.from_settings(settings)
        self.gate = Gatekeeper(settings, catalog, bus, store)
        self._published: list[int] = []  # outbox ids published, not yet deleted
        self._last_publish = 0.0
        self.watch = QueueWatch(settings, bus, store)
        bus.on_reconnect(self.watch.look_now)
        self.ownership = Ownership(settings, database_url_for(settings, "coordinator"))
        self.sender = Sender(bus, self._on_confirmed, recover=self.watch.recover)
        most = settings.partitions * settings.partition_batch
        # A group waits while more than a group's worth of messages wait to be published.
        self.group = GroupCommit(
            self._apply,
            max_batch=most,
            ready=lambda: self.sender.room(most),
            linger=Linger.from_settings(settings),
        )

    async def _command(self, delivery: AbstractIncomingMessage, partition: int) -> None:
        """A client's command, routed by the client straight to its order's partition: checked
        here as the intake would (a refusal is recorded and answered, never dead-lettered), then
        applied in the partition's order, with no hop through the intake and no number (the
        partition's single consumer and the order's blocks keep its order)."""
        examined = await self.gate.examine(delivery, partition=partition)
        if examined is None:
            return
        command, plan = examined
        if isinstance(command, QuerySaga):
            await self.gate.answer(command)
            return
        assert not isinstance(command, DeskCommand)  # refused at a partition
        note = await self._submit(stamped(command), delivery, plan)
        crash_point("coordinator.before_ack")
        log.debug("%s %s %s: %s", command.order_id, command.saga_id, command.type, note)

    async def _block_key(self, delivery: AbstractIncomingMessage) -> str | None:
        """A client's command is applied (and blocks its order) under its stamped id."""
        if delivery.exchange != self.bus.topology.commands_exchange:
            return None
        ident = identify_incoming(delivery)
        with contextlib.suppress(trust.Forged):
            return trust.forwarded_id(await self.gate.sender(delivery, ident) or "",
                                      ident.message_id)  # fmt: skip
        return None

    async def _apply(self, messages: Sequence[PartitionMessage], now: datetime) -> list[str]:
        """One transaction for the group; its outgoing messages go to the sender, which
        publishes them while the next group runs (no relay wake-up, read and delete on the hot
        path). The rows are deleted with a later transaction (or by ``_forget_published``); a
        row whose publish fails stays for the relay."""
        delete = list(self._published)
        notes, sent = await self.store.run_publishing(
            lambda tx: self.processor.handle_batch(tx, messages, now), delete=delete
        )
        self._published = self._published[len(delete) :]
        self.sender.send(sent)
        return notes

    def _on_confirmed(self, ids: list[int]) -> None:
        self._published += ids
        self._last_publish = asyncio.get_running_loop().time()

    async def forget_published(self) -> None:
        """Delete the rows published and not yet deleted (at a stop, once the sender has
        published what it was handed)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.sender.settled(), self.settings.stop_grace_s)
        ids, self._published = self._published, []
        if ids:
            await self.store.forget_published(ids)

    async def _forget_published(self) -> None:
        """Delete published rows when no transaction came to carry the delete."""
        while True:
            await asyncio.sleep(self.settings.relay_poll_s)
            idle = asyncio.get_running_loop().time() - self._last_publish
            if self._published and idle >= self.settings.relay_poll_s:
                ids, self._published = self._published, []
                try:
                    await self.store.forget_published(ids)
                except Exception:  # the relay republishes them later; the inbox absorbs them
                    log.warning("could not delete %d published outbox rows", len(ids))

    async def handle(self, delivery: AbstractIncomingMessage, partition: int) -> None:
        if delivery.exchange == self.bus.topology.commands_exchange:
            await self._command(delivery, partition)
            return
        message = decode_incoming(delivery, PARTITION, self.settings.max_message_bytes)
        check_order_header(delivery, message.order_id)
        if partition_of(message.order_id, self.settings.partitions) != partition:
            raise InvalidMessage(
                f"order {message.order_id} is routed to partition "
                f"{partition_of(message.order_id, self.settings.partitions)}, not {partition}"
            )
        sender = trust.first_sender(self.directory, delivery.user_id, delivery.headers)
        replay = (delivery.headers or {}).get(REPLAY_HEADER)
        if replay is not None and self.directory.is_coordinator(sender):
            found, sender = await self.store.replayed_sender(replay, message.message_id)
            if not found:
                raise Forged("a replay that names no dead letter being replayed")
        trust.partition_message(self.directory, message, sender)
        note = await self._submit(message, delivery)
        crash_point("coordinator.before_ack")
        log.debug("%s %s %s: %s", message.order_id, message.saga_id, message.type, note)

    async def _outcome(self, delivery: AbstractIncomingMessage, partition: int) -> None:
        """An outcome from the partition's classic queue (``handle_or_move``)."""

        async def handle(message: AbstractIncomingMessage) -> None:
            await self.handle(message, partition)

        async def move(copy: Outgoing) -> None:
            await self.bus.publish_raw(self.bus.topology.partitions_exchange, str(partition), copy)

        await handle_or_move(delivery, handle, move)

    async def _submit(
        self, message: PartitionMessage, delivery: AbstractIncomingMessage,
        plan: AdmittedPlan | None = None,
    ) -> str:  # fmt: skip
        """Apply the message (in a group commit), its trace context and the plan the gateway
        admitted for it handed to the processor."""
        context = tracing.extract(delivery.headers)
        if context is not None:
            self.processor.parents[message.message_id] = context
        if plan is not None:
            # By the object, not its id: two commands of one sender may share an id (the inbox
            # applies one), and neither may run with the other's plan.
            self.processor.plans[id(message)] = plan
        try:
            return await self.group.submit(message)
        finally:
            self.processor.parents.pop(message.message_id, None)
            self.processor.plans.pop(id(message), None)

    async def run(self, partitions: Sequence[int] | None = None) -> None:
        """Consume the partitions this process owns (each sequentially, all in parallel) until
        cancelled.

        A partition is owned while this process's lock session holds its lock
        (``saga_coordinator.ownership``). With several coordinator processes, each takes its
        share first (``SAGA_COORDINATOR_SHARE``, ``k/n``: the partitions ``p % n == k``) and the
        others only ``standby_after_s`` later, once free: the processes split the partitions, and
        each takes over what another leaves when it dies or freezes."""
        indexes = range(self.settings.partitions) if partitions is None else partitions
        mine, others = share_of(self.settings.coordinator_share, indexes)
        async with asyncio.TaskGroup() as group:
            group.create_task(self._forget_published(), name="outbox-deletes")
            group.create_task(self.sender.run(), name="sender")
            group.create_task(self.watch.run(), name="request-queues")
            group.create_task(self._own(mine, others), name="partitions")

    async def _own(self, first: Sequence[int], later: Sequence[int]) -> None:
        """Every ``SAGA_WATCHDOG_S``: take what is free and wanted, consume it and send again what
        its running steps have out; stop consuming what another process holds now."""
        consumers: dict[int, asyncio.Task[None]] = {}
        try:
            while True:
                change = await self.ownership.look(consumers, first, later)
                for index in sorted(change.stop):
                    task = consumers.pop(index)
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
                for index in sorted(change.start):
                    consumers[index] = asyncio.create_task(
                        self._consume(index), name=f"partition-{index}"
                    )
                await self.watch.resume(change.resend)
                for task in consumers.values():
                    if task.done():  # a consumer subscribes again on its own: never ends
                        task.result()
                await asyncio.sleep(self.settings.watchdog_s)
        finally:
            for task in consumers.values():
                task.cancel()
            await asyncio.gather(*consumers.values(), return_exceptions=True)
            await self.ownership.close()

    async def _consume(self, index: int) -> None:
        queue = self.bus.topology.partition_queue(index)

        async def handle(delivery: AbstractIncomingMessage) -> None:
            await self.handle(delivery, index)

        async def outcome(delivery: AbstractIncomingMessage) -> None:
            await self._outcome(delivery, index)

        await self.bus.consume(
            queue,
            handle,
            prefetch=self.settings.partition_prefetch,
            mode="sequential",
            # The messages at the partition's head, of distinct orders, in one group commit.
            together=order_header,
            max_batch=self.settings.partition_batch,
            depth=self.settings.partition_depth,
            on_failure=failure_recorder(
                self.store.pool,
                queue,
                block_order=lambda d: self.bus.topology.failure_holds_its_order(d.exchange),
                key=self._block_key,
                hold_s=self.settings.db_retry_s,
            ),
            also=[(self.bus.topology.outcome_queue(index), outcome)],
        )


async def handle_or_move(
    delivery: AbstractIncomingMessage,
    handle: Callable[[AbstractIncomingMessage], Awaitable[None]],
    move: Callable[[Outgoing], Awaitable[None]],
) -> None:
    """An outcome from a partition's classic queue, which neither counts deliveries nor
    dead-letters: handled at its first delivery; one delivered before (its handling failed and
    was requeued, or a process died holding it) or refused (invalid, forged) is moved to the
    partition's quorum queue, which does both, and is handled there. ``move`` publishes with a
    confirm, and the ack follows: a crash between leaves two copies, and the inbox absorbs the
    second. The copy names the user the broker verified on the outcome (``MOVED_HEADER``)."""
    if not delivery.redelivered:
        try:
            await handle(delivery)
            return
        except InvalidMessage:
            pass  # judged again there, and dead-lettered by the broker
    try:
        await move(copy_of(delivery, {MOVED_HEADER: delivery.user_id or ""}))
    except Exception as exc:
        raise RetryLater(f"could not move it to its partition's quorum queue: {exc!r}") from exc
    log.info("outcome %s moved to its partition's quorum queue", delivery.message_id)


def share_of(share: str, indexes: Sequence[int]) -> tuple[list[int], list[int]]:
    """``"k/n"`` -> (the partitions this process takes first, the ones it stands by for)."""
    k, n = (int(x) for x in share.split("/"))
    mine = [i for i in indexes if i % n == k]
    return mine, [i for i in indexes if i % n != k]
