"""One socket write for the AMQP frames queued together.

aiormq's writer task takes one queued frame at a time and writes it: one ``send`` system call
per publish and per ack, even when a batch of publishes (the coordinator's sender, an
adapter's outcomes) was queued in one go. Here the writer's frame source hands it everything
waiting in its queue as one payload: the same bytes in the same order, in one call, and the
broker reads them in one packet instead of one each.

Installed by ``install()`` (``Bus.connect`` calls it) by replacing the frame source aiormq's
writer iterates, the one module global it looks up there, and by giving its write queue room
for a whole batch; nothing else of aiormq changes.
``SAGA_COALESCE_FRAMES=0`` leaves aiormq's own."""

from __future__ import annotations

import asyncio
from typing import Any

import aiormq.connection

_ORIGINAL = aiormq.connection.FrameGenerator
_ORIGINAL_QUEUE = aiormq.connection.Connection.FRAME_BUFFER_SIZE
# aiormq's write queue holds 10 publishes; a batch of 32 (a partition's head, an adapter's
# outcomes) was then 4 writes. Room for 1,024 takes a sender's round (a group's messages) in one
# go: with 64, each publish past the 64th waited for the writer to take one, two turns of the
# loop each, behind every other task of a busy coordinator (gated starts accepted with their
# events published, three alternating rounds: 1,638 -> 1,752/s). The queue stays bounded, so a
# publisher faster than the socket still waits.
QUEUE_FRAMES = 1024
# Queued items are joined into one write until it holds about this (the broker's default frame_max),
# so joining never holds up a heartbeat for long. One item may be larger: a batch of publishes is
# one item (``saga_shared.amqp_internals.batch``), bounded by the sender's round, not by this.
MOST_BYTES = 128 * 1024


class Frames:
    """Several queued frames, written as one: drained and closing as any of them asks."""

    def __init__(self, frames: list[Any]) -> None:
        self.frames = frames
        self.payload = b"".join(f.payload for f in frames)
        self.should_close = any(f.should_close for f in frames)

    @property
    def should_drain(self) -> bool:
        return any(f.should_drain for f in self.frames)

    def drain(self) -> None:
        for frame in self.frames:
            frame.drain()

    def __repr__(self) -> str:
        return f"Frames({len(self.frames)} frames, {len(self.payload)} bytes)"


class CoalescingFrames(_ORIGINAL):
    """aiormq's frame source, handing out what waits in the queue in one go."""

    async def __anext__(self) -> Any:
        first = await super().__anext__()
        if first.should_close:
            return first
        # Turns of the loop while frames keep coming: the other tasks publishing or acking now
        # queue theirs (publishes on one channel take its lock in turn, one a turn), until
        # aiormq's queue is full (``QUEUE_FRAMES``: its back-pressure stays).
        queue: asyncio.Queue[Any] = self.queue
        waiting = -1
        while queue.qsize() != waiting and not queue.full():
            waiting = queue.qsize()
            await asyncio.sleep(0)
        if queue.empty():
            return first
        frames, size = [first], len(first.payload)
        while not queue.empty() and size < MOST_BYTES:
            frame = queue.get_nowait()
            queue.task_done()
            frames.append(frame)
            size += len(frame.payload)
            if frame.should_close:
                break  # nothing is sent after a close
        return Frames(frames)


def install(enabled: bool) -> None:
    """Coalesce (or stop coalescing) the frames of every connection opened from now on."""
    setattr(aiormq.connection, "FrameGenerator", CoalescingFrames if enabled else _ORIGINAL)  # noqa: B010
    aiormq.connection.Connection.FRAME_BUFFER_SIZE = QUEUE_FRAMES if enabled else _ORIGINAL_QUEUE
