"""Finds a request or outcome queue gone, and what may have gone with it (the decision: ``lost``).

Request and outcome queues are classic and not durable (``Topology.request_queue``,
``Topology.outcome_queue``): a broker restart, or on a cluster their node going down, deletes
them with what they held. AMQP tells a publisher nothing of it until a publish comes back
unroutable (a request; an outcome goes to its partition's quorum queue instead, through the
alternate exchange), and nothing at all when no publish comes; so every coordinator looks for
them every ``SAGA_WATCHDOG_S`` (a passive declare each), and at once when its connection is
made again after a drop (``look_now``: a broker restart deletes them). For a request queue that
is gone, as for a publish that came back, it declares the topology again, then hands each step
whose request was out to that service a lost-marked ``saga.deadline`` through its order's
partition (the outbox; the relay publishes). For an outcome queue, the same for every step of
the partition's orders with a request out, whatever its service: its answer may have gone with
the queue, and the request sent again brings it again (the service's key record answers it).
Two coordinators finding the same loss send two such messages for a step: the second finds its
send number stale and is ignored. A coordinator taking partitions over does the same for their
orders, every service (``resume``): the loss may have come while nobody watched.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from asyncio import current_task
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
        self._now = asyncio.Event()  # look at once (``look_now``), not at the next interval

    def look_now(self) -> None:
        """Look before the next interval: the bus is connected again after a drop, and the
        broker may have restarted meanwhile (its transient queues gone with what they held)."""
        self._now.set()

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
        the lock session was lost), or their outcome queues found gone: send again every
        request their running steps have out, uncounted, since a request or outcome queue may
        have been lost while nobody owned them. What was
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
            log.info("partition(s) %s: %d running request(s) sent again, uncounted",
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
        requests = {t.request_queue(s): s for s in t.services}
        outcomes = {t.outcome_queue(p): p for p in range(t.partitions)}
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._now.wait(), self.settings.watchdog_s)
            self._now.clear()
            try:
                missing = set(await self.bus.missing([*requests, *outcomes]))
                gone = {requests[q] for q in missing if q in requests} | self._owed
                lost = sorted(outcomes[q] for q in missing if q in outcomes)
                if gone:
                    await self.recover(gone)  # declares the topology, outcome queues too
                elif lost:
                    await self.bus.declare()
                if lost:
                    log.warning("outcome queue(s) of partition(s) %s were gone: declared again",
                                lost)  # fmt: skip
                    await self.resume(lost)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the broker or the database away: look again later
                log.warning("could not look for the request and outcome queues: %r", exc)
            task = current_task()
            if task is not None and task.cancelling():
                # Cancelled during the look, and the cancel swallowed on the way or come out as
                # another error (aiormq closing a channel whose call was cancelled): a stop
                # waited for ever on this task before.
                raise asyncio.CancelledError
