"""A batch of publishes queued on the channel in one go, each with its own confirm.

aiormq publishes one message per call: a task, the channel's lock, a timeout scope and a queued
frame each, about 45 us of a process's CPU a message in a pipelined batch (measured: 512
messages to the events exchange with confirms). ``publish`` does what those calls do (a delivery
tag and a confirm future per message, the message id noted so a return finds its publish) for
the whole batch under one hold of the lock, and queues every frame as one item: 20-28 us a
message. The broker sees the same frames in the same order. What each message gets is what
aiormq's ``basic_publish`` gives: ``None`` once confirmed, else the error (a return, a nack, the
channel closing, or ``TimeoutError`` when no confirm came in time). ``Bus`` uses it for pipelined
batches when ``SAGA_FAST_FRAMES`` is on (the default) and every message has a message id (a
return is matched to its publish by it)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

import aiormq
from aiormq.abc import ChannelFrame
from pamqp import commands as spec
from pamqp.header import ContentHeader

# exchange, routing key, body, properties (with a message id), mandatory
Publish = tuple[str, str, bytes, spec.Basic.Properties, bool]


async def publish(
    channel: aiormq.Channel, publishes: Sequence[Publish], confirm_within_s: float
) -> list[BaseException | None]:
    """Queue every publish in order, then wait up to ``confirm_within_s`` for their confirms."""
    if not publishes:
        return []
    futures, first = await _queue(channel, publishes)
    done, _ = await asyncio.wait(futures, timeout=confirm_within_s)
    for future in futures:  # in order, not the waiting set's (by address)
        if future not in done:
            future.cancel()  # its confirm, if it comes, is ignored (as aiormq does on a timeout)
    _forget(channel, publishes, first)
    return [_outcome(future, done) for future in futures]


def _forget(channel: aiormq.Channel, publishes: Sequence[Publish], first: int) -> None:
    """Drop the message ids noted for returns, but one a later publish of the same id took
    over (aiormq keeps the same rule)."""
    ids = channel.message_id_delivery_tag
    for tag, (_, _, _, properties, _) in enumerate(publishes, start=first):
        if ids.get(properties.message_id or "") == tag:
            del ids[properties.message_id or ""]


def _outcome(future: asyncio.Future[Any], done: set[asyncio.Future[Any]]) -> BaseException | None:
    if future not in done:
        return TimeoutError("no confirm from the broker in time")
    if future.cancelled():
        return asyncio.CancelledError("cancelled before the broker's confirm")
    return future.exception()


async def _queue(
    channel: aiormq.Channel, publishes: Sequence[Publish]
) -> tuple[list[asyncio.Future[Any]], int]:
    """The publishes' confirm futures, and the first one's delivery tag."""
    frames: list[Any] = []
    futures: list[asyncio.Future[Any]] = []
    async with channel.lock:
        first = channel.delivery_tag + 1
        for exchange, routing_key, body, properties, mandatory in publishes:
            channel.delivery_tag += 1
            future = channel.create_future()
            channel.confirmations[channel.delivery_tag] = future
            channel.message_id_delivery_tag[properties.message_id or ""] = channel.delivery_tag
            futures.append(future)
            frames.append(
                spec.Basic.Publish(exchange=exchange, routing_key=routing_key, mandatory=mandatory)
            )
            frames.append(ContentHeader(properties=properties, body_size=len(body)))
            frames += channel._split_body(body)
        try:
            await channel.write_queue.put(
                ChannelFrame.marshall(frames=frames, channel_number=channel.number)
            )
        except BaseException:
            # Nothing reached the broker: the tags are free again, as aiormq frees one.
            for tag in range(first, channel.delivery_tag + 1):
                channel.confirmations.pop(tag, None)
            _forget(channel, publishes, first)
            for future in futures:
                with contextlib.suppress(asyncio.InvalidStateError):
                    future.cancel()
            channel.delivery_tag = first - 1
            raise
    return futures, first
