"""Publishes what the group commits committed, in commit order, off their critical path.

A group's deliveries may be acked as soon as its transaction commits: its outgoing messages are
outbox rows by then, and a crash before their confirms leaves them to the relay. So the group
hands its rows here and returns; the next group's transaction runs while these wait for their
confirms. One sender per coordinator publishes everything handed in since its last round as
one pipelined batch, in the order handed in: one order's messages never overtake each other.
A row the broker does not confirm stays in the outbox for the relay.

The commits wait for the publishes (``room``): a group does not start while more rows than a
group's worth wait for a round. Without that, a flood of commands had the groups commit faster
than the sender published (measured: 20,000 gated starts in the register while 36,000 of their
events still waited in memory, the next round 30,000 publishes at once), rows piled up in memory
and in the outbox, and the relay published again whatever stayed there past
``outbox_stale_s``."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Sequence

from saga_coordinator.rows import OutboxRow
from saga_shared.crashpoints import crash_point
from saga_shared.transport.bus import Bus, Item, unroutable

log = logging.getLogger(__name__)
Recover = Callable[[Collection[str]], Awaitable[object]]


class Sender:
    """``confirmed``: told the outbox ids of every round's confirmed rows (to delete them)."""

    def __init__(
        self, bus: Bus, confirmed: Callable[[list[int]], None], recover: Recover | None = None
    ) -> None:
        """``recover``: told the services whose request queue a publish found gone; declares
        them again (``QueueWatch.recover``; by default the bus declares the topology)."""
        self.bus = bus
        self._confirmed = confirmed
        self._recover = recover or (lambda _: bus.declare())
        self._rows: list[tuple[int, OutboxRow]] = []
        self._more = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._taken = asyncio.Event()  # set when a round takes the rows handed in
        self._stopped = False

    def send(self, rows: Sequence[tuple[int, OutboxRow]]) -> None:
        # Stopped, rows stay the relay's (they are in the outbox): a delivery finished during a
        # graceful stop must not wait for room, nor the stop for rounds that never come.
        if rows and not self._stopped:
            self._rows += rows
            self._idle.clear()
            self._more.set()

    async def room(self, most: int) -> None:
        """Return once at most ``most`` rows wait for a round (the one running may hold more)."""
        while len(self._rows) > most:
            self._taken.clear()
            await self._taken.wait()

    async def settled(self) -> None:
        """Return once everything handed in has been published or left to the relay."""
        await self._idle.wait()

    async def run(self) -> None:
        try:
            while True:
                await self._more.wait()
                self._more.clear()
                rows, self._rows = self._rows, []
                self._taken.set()
                await self._publish(rows)
                if not self._rows:
                    self._idle.set()
        finally:  # cancelled: what was not published is the relay's (it is in the outbox)
            self._stopped = True
            self._rows = []
            self._taken.set()
            self._idle.set()

    async def _publish(self, rows: list[tuple[int, OutboxRow]]) -> None:
        crash_point("coordinator.before_publish")
        items = [(row.exchange, row.routing_key, row.amqp()) for _, row in rows]
        try:
            errors = await self.bus.publish_many(items, local=[row.local for _, row in rows])
            if any(errors):
                await self._requests_again(rows, items, errors)
        except Exception as exc:  # the broker is away: the relay publishes them later
            log.warning("publishing after commit failed (%r); the relay will", exc)
            return
        self._confirmed([id_ for (id_, _), error in zip(rows, errors, strict=True) if not error])

    async def _requests_again(
        self, rows: list[tuple[int, OutboxRow]], items: Sequence[Item],
        errors: list[BaseException | None],
    ) -> None:  # fmt: skip
        """Requests that came back unroutable: their queue went with its node (a request queue
        is not durable), so it is declared again (and what went with it sent again) and they
        are sent again at once (``errors`` updated); a request is never buried."""
        topology = self.bus.topology
        lost = [i for i, (error, (_, row)) in enumerate(zip(errors, rows, strict=True))
                if error is not None and unroutable(error)
                and topology.is_request_route(row.exchange, row.routing_key)]  # fmt: skip
        if not lost:
            return
        log.warning("%d request(s) came back unroutable: declaring their queues again", len(lost))
        try:
            await self._recover({rows[i][1].routing_key.removeprefix("request.") for i in lost})
            again = await self.bus.publish_many([items[i] for i in lost])
        except Exception as exc:  # the broker is away: the relay sends them (and declares)
            log.warning("declaring the request queues again failed (%r); the relay will", exc)
            return
        for i, error in zip(lost, again, strict=True):
            errors[i] = error
