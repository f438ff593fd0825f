"""The bus's batch publish keeps the list's order on the wire and reports each message apart."""

from __future__ import annotations

import asyncio

import aio_pika
import aiormq

from shared.bus import Bus


async def test_a_batch_arrives_in_the_order_it_was_given(bus: Bus) -> None:
    channel = await bus.connection.channel()
    queue = await channel.declare_queue(exclusive=True)
    bodies = [f"m{i}".encode() for i in range(300)]

    errors = await bus.publish_many([("", queue.name, aio_pika.Message(b)) for b in bodies])

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


async def test_an_unroutable_message_fails_alone_in_its_batch(bus: Bus) -> None:
    channel = await bus.connection.channel()
    queue = await channel.declare_queue(exclusive=True)
    actions = bus.topology.actions_exchange
    items = [
        ("", queue.name, aio_pika.Message(b"first")),
        (actions, "no-such-service", aio_pika.Message(b"lost")),  # mandatory, no queue bound
        ("", queue.name, aio_pika.Message(b"last")),
    ]

    first, lost, last = await bus.publish_many(items)

    assert first is None and last is None
    assert isinstance(lost, aiormq.exceptions.PublishError)
    got = [await queue.get(timeout=5) for _ in range(2)]
    assert [m.body for m in got] == [b"first", b"last"]
    await asyncio.gather(*(m.ack() for m in got))
    await channel.close()


async def test_a_missing_exchange_fails_alone_and_the_connection_survives(bus: Bus) -> None:
    channel = await bus.connection.channel()
    queue = await channel.declare_queue(exclusive=True)
    await bus.publish_raw("", queue.name, aio_pika.Message(b"proven"))  # the default exchange
    items = [("", queue.name, aio_pika.Message(f"before-{i}".encode())) for i in range(20)]
    items.append(("no-such-exchange", "x", aio_pika.Message(b"nowhere")))
    items += [("", queue.name, aio_pika.Message(f"after-{i}".encode())) for i in range(20)]

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
