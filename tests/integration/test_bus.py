"""The bus's batch publish keeps the list's order on the wire and reports each message apart,
queued in one go (``saga_shared.amqp_internals.batch``: messages with ids) or one publish at a time
(without)."""

from __future__ import annotations

import asyncio

import aio_pika
import aiormq
import pytest

from saga_shared.transport.bus import Bus

pytestmark = pytest.mark.parametrize("ids", [True, False], ids=["batched", "one-by-one"])


def msg(body: bytes, ids: bool) -> aio_pika.Message:
    return aio_pika.Message(body, message_id=f"id-{body.decode()}" if ids else None)


async def test_a_batch_arrives_in_the_order_it_was_given(bus: Bus, ids: bool) -> None:
    channel = await bus.connection.channel()
    queue = await channel.declare_queue(exclusive=True)
    bodies = [f"m{i}".encode() for i in range(300)]

    errors = await bus.publish_many([("", queue.name, msg(b, ids)) for b in bodies])

    assert errors == [None] * len(bodies)
    received = []
    async with queue.iterator() as messages:
        async for message in messages:
            received.append(message.body)
            await message.ack()
            if len(received) == len(bodies):
                break
    assert received == bodies
    await channel.close()


async def test_an_unroutable_message_fails_alone_in_its_batch(bus: Bus, ids: bool) -> None:
    channel = await bus.connection.channel()
    queue = await channel.declare_queue(exclusive=True)
    actions = bus.topology.actions_exchange
    # Both exchanges reached once: the batch goes pipelined, not each publish alone.
    await bus.publish_raw("", queue.name, msg(b"proven", ids))
    await bus.publish_raw(actions, "inventory", msg(b"warm", ids))
    items = [
        ("", queue.name, msg(b"first", ids)),
        (actions, "no-such-service", msg(b"lost", ids)),  # mandatory, no queue bound
        ("", queue.name, msg(b"last", ids)),
    ]

    first, lost, last = await bus.publish_many(items)

    assert first is None and last is None
    assert isinstance(lost, aiormq.exceptions.PublishError)
    got = [await queue.get(timeout=5) for _ in range(3)]
    assert [m.body for m in got] == [b"proven", b"first", b"last"]
    await asyncio.gather(*(m.ack() for m in got))
    await channel.close()


async def test_a_missing_exchange_fails_alone_and_the_connection_survives(
    bus: Bus, ids: bool
) -> None:
    channel = await bus.connection.channel()
    queue = await channel.declare_queue(exclusive=True)
    await bus.publish_raw("", queue.name, aio_pika.Message(b"proven"))  # the default exchange
    items = [("", queue.name, msg(f"before-{i}".encode(), ids)) for i in range(20)]
    items.append(("no-such-exchange", "x", msg(b"nowhere", ids)))
    items += [("", queue.name, msg(f"after-{i}".encode(), ids)) for i in range(20)]

    errors = await bus.publish_many(items)

    assert isinstance(errors[20], aiormq.exceptions.ChannelNotFoundEntity)
    assert errors[:20] == [None] * 20 and errors[21:] == [None] * 20
    bodies = []
    for _ in range(41):
        message = await queue.get(timeout=5)
        bodies.append(message.body.decode())
        await message.ack()
    assert bodies == ["proven"] + [f"before-{i}" for i in range(20)] + [
        f"after-{i}" for i in range(20)
    ]
    assert not bus.connection.is_closed
    await channel.close()


async def test_a_missing_exchange_never_closes_the_channel_another_publisher_uses(
    bus: Bus, ids: bool
) -> None:
    """Two publishers on one bus, as the sender and the relay are: one pipelines to a queue while
    the other keeps publishing to an exchange that does not exist. Every good publish is
    confirmed and the connection stays open (before, the missing exchange's 404 closed the
    shared channel under the other's frames, and the broker then closed the connection)."""
    channel = await bus.connection.channel()
    queue = await channel.declare_queue(exclusive=True)
    await bus.publish_raw("", queue.name, aio_pika.Message(b"proven"))

    async def good() -> list[BaseException | None]:
        errors: list[BaseException | None] = []
        for i in range(20):
            batch = [("", queue.name, msg(f"{i}-{j}".encode(), ids)) for j in range(10)]
            errors += await bus.publish_many(batch)
        return errors

    async def bad() -> list[BaseException | None]:
        return [
            (await bus.publish_many([("no-such-exchange", "x", msg(b"nowhere", ids))]))[0]
            for _ in range(20)
        ]

    confirmed, refused = await asyncio.gather(good(), bad())

    assert confirmed == [None] * 200
    assert all(isinstance(e, aiormq.exceptions.ChannelNotFoundEntity) for e in refused)
    assert not bus.connection.is_closed
    await bus.publish_raw("", queue.name, aio_pika.Message(b"still"))
    assert (await queue.declare()).message_count == 202
    await channel.close()
