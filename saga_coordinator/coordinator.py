"""The coordinator: consumes the partitions, one message at a time per partition, and applies
each to its saga in one transaction (``Store.apply``) using the pure ``machine.decide``."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from datetime import UTC, datetime

from aio_pika.abc import AbstractIncomingMessage

from saga_coordinator.machine import Reply, Transition, decide
from saga_coordinator.store import Handled, OutboxRow, Store
from shared.bus import Bus
from shared.catalog import Catalog
from shared.codec import PARTITION, decode_incoming
from shared.config import Settings
from shared.messages import ActionRequest
from shared.topology import Topology

log = logging.getLogger(__name__)


def route(topology: Topology, transition: Transition) -> list[OutboxRow]:
    """Where each outgoing message goes: requests to their service's queue, replies to the
    agent's reply queue, lifecycle events to the public topic exchange under their type."""
    rows = []
    for item in transition.out:
        if isinstance(item, Reply):
            rows.append(OutboxRow("", item.to, item.message))
        elif isinstance(item, ActionRequest):
            service = item.action.split(".", 1)[0]
            rows.append(OutboxRow(topology.actions_exchange, service, item))
        else:
            rows.append(OutboxRow(topology.events_exchange, item.type, item))
    return rows


class Coordinator:
    def __init__(self, settings: Settings, catalog: Catalog, bus: Bus, store: Store) -> None:
        self.settings = settings
        self.catalog = catalog
        self.bus = bus
        self.store = store

    async def handle(self, delivery: AbstractIncomingMessage) -> None:
        message = decode_incoming(delivery, PARTITION, self.settings.max_message_bytes)
        now = datetime.now(UTC)
        handled: Handled = await self.store.apply(
            message,
            lambda state: decide(state, message, self.catalog, now),
            lambda transition: route(self.bus.topology, transition),
            now,
        )
        if handled.transition is None:
            log.info("duplicate %s %s absorbed", message.type, message.message_id)
        else:
            log.debug("%s %s: %s", message.saga_id, message.type, handled.transition.note)

    async def run(self, partitions: Sequence[int] | None = None) -> None:
        """Consume every partition (each sequentially, all in parallel) until cancelled."""
        indexes = range(self.settings.partitions) if partitions is None else partitions
        async with asyncio.TaskGroup() as group:
            for index in indexes:
                group.create_task(
                    self.bus.consume(
                        self.bus.topology.partition_queue(index),
                        self.handle,
                        prefetch=self.settings.partition_prefetch,
                        mode="sequential",
                    ),
                    name=f"partition-{index}",
                )
