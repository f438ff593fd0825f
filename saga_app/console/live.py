"""Live updates: one queue of this process bound to the events exchange, fanned out to every
open page as server-sent events. A page only learns that something changed (type, saga and
order); it then reloads its own list, so what it shows always comes from the database."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator

from aio_pika.abc import AbstractIncomingMessage

from saga_shared.transport.bus import Bus
from saga_shared.transport.codec import peek

log = logging.getLogger(__name__)
_HEARTBEAT_S = 15.0
_BUFFER = 64


class Hub:
    def __init__(self) -> None:
        self._listeners: set[asyncio.Queue[str | None]] = set()
        self._closed = False

    @property
    def listeners(self) -> int:
        return len(self._listeners)

    def close(self) -> None:
        """End every stream (the process stops): an open page would otherwise hold it up."""
        self._closed = True
        for queue in self._listeners:
            with contextlib.suppress(asyncio.QueueEmpty):
                queue.get_nowait()  # room for the end, even in a full queue
            queue.put_nowait(None)

    def publish(self, data: str) -> None:
        for queue in self._listeners:
            if queue.full():  # a slow page misses updates, never the others
                with contextlib.suppress(asyncio.QueueEmpty):
                    queue.get_nowait()
            queue.put_nowait(data)

    async def stream(self) -> AsyncIterator[str]:
        """``text/event-stream`` lines for one page, until it goes away."""
        queue: asyncio.Queue[str | None] = asyncio.Queue(_BUFFER)
        self._listeners.add(queue)
        try:
            yield "retry: 3000\n\n"
            while not self._closed:
                try:
                    data = await asyncio.wait_for(queue.get(), _HEARTBEAT_S)
                except TimeoutError:
                    yield ": still here\n\n"  # keeps proxies from closing an idle stream
                    continue
                if data is None:
                    return
                yield f"data: {data}\n\n"
        finally:
            self._listeners.discard(queue)


async def follow_events(bus: Bus, hub: Hub) -> None:
    """Feed ``hub`` from the events exchange until cancelled (a private, auto-deleted queue;
    events that pass while the broker is away are simply not shown live)."""
    channel = await bus.connection.channel()
    try:
        queue = await channel.declare_queue(exclusive=True, auto_delete=True)
        exchange = await channel.get_exchange(bus.topology.events_exchange, ensure=True)
        await queue.bind(exchange, routing_key="#")

        async def on_event(message: AbstractIncomingMessage) -> None:
            # Only well-formed identifiers reach a page; the page reloads from the database.
            ids = peek(message.body)
            hub.publish(json.dumps({k: ids[k] for k in ("type", "saga_id", "order_id")}))

        await queue.consume(on_event, no_ack=True)
        await asyncio.Future()  # until cancelled
    finally:
        with contextlib.suppress(Exception):
            await channel.close()
