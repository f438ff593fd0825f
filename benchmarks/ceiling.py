"""The broker's own ceiling: persistent messages published with confirms to a quorum queue and
consumed, with nothing else on the path."""

from __future__ import annotations

import asyncio
import time
import uuid

import aio_pika


async def raw_broker_rate(amqp_url: str, messages: int, in_flight: int = 256) -> float:
    """Messages per second through one quorum queue, publish (confirmed) to consume (acked)."""
    name = f"bench-ceiling-{uuid.uuid4().hex[:8]}"
    connection = await aio_pika.connect(amqp_url)
    try:
        publisher = await connection.channel(publisher_confirms=True)
        consumer = await connection.channel()
        await consumer.set_qos(prefetch_count=in_flight)
        queue = await consumer.declare_queue(
            name, durable=True, arguments={"x-queue-type": "quorum"}
        )
        received = 0
        done = asyncio.Event()

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            nonlocal received
            await message.ack()
            received += 1
            if received == messages:
                done.set()

        tag = await queue.consume(on_message)
        body = b"x" * 400  # about the size of a saga message
        window = asyncio.Semaphore(in_flight)

        async def publish() -> None:
            async with window:
                await publisher.default_exchange.publish(
                    aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                    name,
                    timeout=30,
                )

        started = time.perf_counter()
        await asyncio.gather(*(publish() for _ in range(messages)))
        await asyncio.wait_for(done.wait(), 120)
        elapsed = time.perf_counter() - started
        await queue.cancel(tag)
        await consumer.queue_delete(name)
        return messages / elapsed
    finally:
        await connection.close()
