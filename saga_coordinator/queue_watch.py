"""Finds a request queue gone, and what may have gone with it (the decision: ``lost``).

A request queue is classic and not durable (``Topology.request_queue``): a broker restart, or on
a cluster its node going down, deletes it with the requests in it. AMQP tells a publisher nothing
of it until a publish comes back unroutable, and nothing at all when no publish comes; so every
coordinator looks for its request queues every ``SAGA_WATCHDOG_S`` (a passive declare each)
and, for one that is gone,
as for a publish that came back: declares the topology again, then hands each step whose
request was out to that service a lost-marked ``saga.deadline`` through its order's partition
(the outbox; the relay publishes).
Two coordinators finding the same loss send two such messages for a step: the second finds its
send number stale and is ignored. A coordinator taking partitions over does the same for their
orders, every service (``resume``): the loss may have come while nobody watched.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection

from saga_coordinator.lost import marked
from saga_coordinator.rows import OutboxRow
from saga_coordinator.store import Q, Store, Tx
from saga_shared.config import Settings
from saga_shared.transport.bus import Bus
from saga_shared.transport.topology import partition_of

log = logging.getLogger(__name__)


class QueueWatch:
    def __init__(self, settings: Settings, bus: Bus, store: Store) -> None:
        self.settings = settings
        self.bus = bus
        self.store = store
        # Services whose queue was found gone and whose lost requests are not sent again yet
        # (the broker or the database failed meanwhile): the next look tries again, since the
        # queue, declared by then, would no longer say so.
        self._owed: set[str] = set()
        # Partitions taken over whose running requests are not sent again yet.
        self._owed_partitions: set[int] = set()

    async def recover(self, services: Collection[str]) -> int:
        """``services``' request queues were found gone: declare them again, then send again
        what was out to them. How many steps were handed a resend."""
        self._owed |= set(services)
        await self.bus.declare()
        owed = set(self._owed)
        sent = await self.store.run(lambda tx: self._resend(tx, owed))
        self._owed -= owed
        log.warning("request queue(s) of %s were gone: declared again, %d request(s) sent again",
                    ", ".join(sorted(owed)), sent)  # fmt: skip
        return sent

    async def resume(self, partitions: Collection[int]) -> None:
        """``partitions`` were just taken (at a start, from a process that died or froze, after
        the lock session was lost): send again every request their running steps have out,
        uncounted, since a request queue may have been lost while nobody owned them. What was
        not lost is absorbed by the services' key records, or answered by the process still
        calling it. The database away: owed, sent at the next look."""
        self._owed_partitions |= set(partitions)
        if not self._owed_partitions:
            return
        owed = set(self._owed_partitions)
        services = self.bus.topology.services
        try:
            sent = await self.store.run(lambda tx: self._resend(tx, services, owed))
        except Exception as exc:
            log.warning("could not send again the requests out of partition(s) %s: %r",
                        sorted(owed), exc)  # fmt: skip
            return
        self._owed_partitions -= owed
        if sent:
            log.info("partition(s) %s taken: %d running request(s) sent again, uncounted",
                     sorted(owed), sent)  # fmt: skip

    async def _resend(
        self, tx: Tx, services: Collection[str], partitions: Collection[int] | None = None
    ) -> int:
        """Lost-marked deadlines for the steps with a request out to ``services`` (of the
        orders in ``partitions``: all of them when None)."""
        t = self.bus.topology
        patterns = [f"%:{s}.%" for s in services]
        out = [
            OutboxRow.of(t.partitions_exchange, t.partition_key(message.order_id), message)
            for row in await tx.conn.fetch(Q.requests_out, patterns)
            if partitions is None or partition_of(row["order_id"], t.partitions) in partitions
            for message in marked(
                row["saga_id"],
                row["order_id"],
                row["step"],
                row["phase"],
                row["idempotency_key"],
                row["attempt"],
                services,
            )
        ]
        tx.outbox(out)
        return len(out)

    async def run(self) -> None:
        t = self.bus.topology
        queues = {t.request_queue(s): s for s in t.services}
        while True:
            await asyncio.sleep(self.settings.watchdog_s)
            try:
                gone = {queues[q] for q in await self.bus.missing(list(queues))} | self._owed
                if gone:
                    await self.recover(gone)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the broker or the database away: look again later
                log.warning("could not look for the request queues: %r", exc)
