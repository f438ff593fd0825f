"""The coordinator: consumes the partitions, one message at a time per partition, and applies
them through the ``Processor``, the messages of different partitions that arrive together in
one transaction (``GroupCommit``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from datetime import datetime

from aio_pika.abc import AbstractIncomingMessage

from saga_coordinator.group_commit import GroupCommit
from saga_coordinator.processor import Processor
from saga_coordinator.store import Store
from shared import trust
from shared.bus import Bus
from shared.catalog import Catalog
from shared.codec import PARTITION, decode_incoming
from shared.config import Settings
from shared.crashpoints import crash_point
from shared.errors import InvalidMessage
from shared.failures import failure_recorder
from shared.identity import Directory
from shared.messages import PartitionMessage
from shared.topology import partition_of
from shared.trust import REPLAY_HEADER, Forged

log = logging.getLogger(__name__)


class Coordinator:
    def __init__(self, settings: Settings, catalog: Catalog, bus: Bus, store: Store) -> None:
        self.settings = settings
        self.bus = bus
        self.store = store
        self.processor = Processor(catalog, bus.topology)
        self.directory = Directory.from_settings(settings)
        self.group = GroupCommit(self._apply, max_batch=settings.partitions)

    async def _apply(self, messages: Sequence[PartitionMessage], now: datetime) -> list[str]:
        return await self.store.run(lambda tx: self.processor.handle_batch(tx, messages, now))

    async def handle(self, delivery: AbstractIncomingMessage, partition: int) -> None:
        message = decode_incoming(delivery, PARTITION, self.settings.max_message_bytes)
        if partition_of(message.order_id, self.settings.partitions) != partition:
            raise InvalidMessage(
                f"order {message.order_id} is routed to partition "
                f"{partition_of(message.order_id, self.settings.partitions)}, not {partition}"
            )
        sender = delivery.user_id
        replay = (delivery.headers or {}).get(REPLAY_HEADER)
        if replay is not None and self.directory.is_coordinator(sender):
            found, sender = await self.store.replayed_sender(replay, message.message_id)
            if not found:
                raise Forged("a replay that names no dead letter being replayed")
        trust.partition_message(self.directory, message, sender)
        note = await self.group.submit(message)
        crash_point("coordinator.before_ack")
        log.debug("%s %s %s: %s", message.order_id, message.saga_id, message.type, note)

    async def run(self, partitions: Sequence[int] | None = None) -> None:
        """Consume every partition (each sequentially, all in parallel) until cancelled.

        Each partition has a single active consumer: the first subscribed. With several
        coordinator processes, each subscribes first to its share (``SAGA_COORDINATOR_SHARE``,
        ``k/n``: the partitions ``p % n == k``) and to the others only ``standby_after_s`` later,
        so the processes split the partitions and each stands by for the rest."""
        indexes = range(self.settings.partitions) if partitions is None else partitions
        mine, others = share_of(self.settings.coordinator_share, indexes)
        async with asyncio.TaskGroup() as group:
            for index in mine:
                group.create_task(self._consume(index), name=f"partition-{index}")
            if others:
                await asyncio.sleep(self.settings.standby_after_s)
            for index in others:
                group.create_task(self._consume(index), name=f"partition-{index}")

    async def _consume(self, index: int) -> None:
        queue = self.bus.topology.partition_queue(index)

        async def handle(delivery: AbstractIncomingMessage) -> None:
            await self.handle(delivery, index)

        await self.bus.consume(
            queue,
            handle,
            prefetch=self.settings.partition_prefetch,
            mode="sequential",
            on_failure=failure_recorder(self.store.pool, queue, block_order=True),
        )


def share_of(share: str, indexes: Sequence[int]) -> tuple[list[int], list[int]]:
    """``"k/n"`` -> (the partitions this process takes first, the ones it stands by for)."""
    k, n = (int(x) for x in share.split("/"))
    mine = [i for i in indexes if i % n == k]
    return mine, [i for i in indexes if i % n != k]
