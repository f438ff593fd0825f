"""Fires step deadlines: a due deadline becomes a ``saga.deadline`` message in its order's
partition (through the outbox), so it is handled in order like any other message. Due rows are
taken with FOR UPDATE SKIP LOCKED and deleted in the same transaction: several coordinators
never fire one deadline twice."""

from __future__ import annotations

import asyncio
import logging

from saga_coordinator.rows import OutboxRow
from saga_coordinator.store import Q, Store, Tx
from saga_shared.config import Settings
from saga_shared.model.messages import DeadlineReached
from saga_shared.transport.topology import Topology

log = logging.getLogger(__name__)


class DeadlineTimer:
    def __init__(self, settings: Settings, store: Store, topology: Topology) -> None:
        self.settings = settings
        self.store = store
        self.topology = topology

    async def fire_due(self) -> int:
        async def work(tx: Tx) -> int:
            rows = await tx.conn.fetch(Q.deadlines_due, 100)
            out = []
            for row in rows:
                message = DeadlineReached(
                    saga_id=row["saga_id"],
                    order_id=row["order_id"],
                    step=row["step"],
                    phase=row["phase"],
                    idempotency_key=row["idempotency_key"],
                    attempt=row["attempt"],
                )
                key = self.topology.partition_key(message.order_id)
                out.append(OutboxRow.of(self.topology.partitions_exchange, key, message))
                tx.disarm_deadline(message.saga_id)
            tx.outbox(out)
            return len(rows)

        return await self.store.run(work)

    async def run(self) -> None:
        while True:
            try:
                fired = await self.fire_due()
                if fired:
                    log.info("fired %d deadline(s)", fired)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.warning("deadline timer failed; retrying", exc_info=True)
            await asyncio.sleep(self.settings.deadline_poll_s)
