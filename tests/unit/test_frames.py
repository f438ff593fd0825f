"""The frames queued together go out as one write: the same bytes, in the same order, drained
and closing as each frame asked."""

from __future__ import annotations

import asyncio

import aiormq.connection
from aiormq.abc import ChannelFrame

from saga_shared.amqp_internals import frames
from saga_shared.amqp_internals.frames import CoalescingFrames, Frames


def frame(payload: bytes, *, close: bool = False, drain: bool = False) -> ChannelFrame:
    future = asyncio.get_running_loop().create_future() if drain else None
    return ChannelFrame(payload=payload, should_close=close, drain_future=future)


async def writes(*queued: ChannelFrame, later: tuple[ChannelFrame, ...] = ()) -> list[bytes]:
    """What aiormq's writer would write for ``queued`` (and ``later``, queued by another task
    in the turns after the first write was taken)."""
    queue: asyncio.Queue[ChannelFrame] = asyncio.Queue(maxsize=10)
    for f in queued:
        queue.put_nowait(f)

    async def publisher() -> None:
        for f in later:  # as a channel's lock passes from one publish to the next
            await queue.put(f)
            await asyncio.sleep(0)

    source = CoalescingFrames(queue)
    feeding = asyncio.create_task(publisher())
    out, taken = [], 0
    while taken < len(queued) + len(later):
        got = await source.__anext__()
        out.append(got.payload)
        taken += len(got.frames) if isinstance(got, Frames) else 1
        if got.should_close:
            break
    feeding.cancel()
    return out


async def test_frames_waiting_together_are_one_write_in_queue_order() -> None:
    assert await writes(frame(b"a"), frame(b"b"), frame(b"c")) == [b"abc"]


async def test_frames_queued_in_the_next_turns_join_the_write() -> None:
    # publishes on one channel take its lock in turn: one frame a turn of the loop
    assert await writes(frame(b"a"), later=(frame(b"b"), frame(b"c"))) == [b"abc"]


async def test_a_full_queue_is_written_at_once() -> None:
    # once the queue (ten here) is full the write goes, without waiting for more
    tens = [frame(bytes([i])) for i in range(10)]
    later = (frame(b"y"), frame(b"z"))
    assert await writes(*tens, later=later) == [bytes(range(10)) + b"y", b"z"]


async def test_nothing_is_joined_after_a_close() -> None:
    assert await writes(frame(b"a"), frame(b"close", close=True), frame(b"x")) == [b"aclose"]


async def test_draining_the_joined_write_drains_every_frame_that_asked() -> None:
    first, second, third = frame(b"a", drain=True), frame(b"b"), frame(b"c", drain=True)
    joined = Frames([first, second, third])
    assert joined.should_drain and not joined.should_close
    joined.drain()
    assert first.drain_future is not None and first.drain_future.done()
    assert third.drain_future is not None and third.drain_future.done()
    assert not joined.should_drain


def test_install_swaps_the_frame_source_aiormqs_writer_iterates() -> None:
    original = frames._ORIGINAL
    try:
        frames.install(True)
        assert aiormq.connection.FrameGenerator is CoalescingFrames
        assert aiormq.connection.Connection.FRAME_BUFFER_SIZE == frames.QUEUE_FRAMES
        frames.install(False)
        assert aiormq.connection.FrameGenerator is original
        assert aiormq.connection.Connection.FRAME_BUFFER_SIZE == frames._ORIGINAL_QUEUE
    finally:
        frames.install(True)
