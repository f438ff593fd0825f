"""A consumer the broker cancels (its queue deleted, as when a request queue's node goes) is
subscribed again at once, not at the next look of its watchdog."""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import aio_pika
from prometheus_client import REGISTRY

from saga_shared.config import Settings
from saga_shared.transport.bus import Bus
from tests.integration.helpers import remove_namespace


def restarts(queue: str) -> float:
    """``saga_consumer_restarts_total`` for ``queue``, as Prometheus scrapes it."""
    return REGISTRY.get_sample_value("saga_consumer_restarts_total", {"queue": queue}) or 0.0


async def test_a_consumer_the_broker_cancels_subscribes_again_without_waiting_for_its_watchdog(
    settings: Settings,
) -> None:
    # A watchdog that would look only after the test's own bound: only the cancel can wake it.
    async with Bus(settings.with_(watchdog_s=3600.0)) as bus:
        name = f"{settings.namespace}.cancel-{uuid.uuid4().hex[:8]}"
        channel = await bus.connection.channel()
        queue = await channel.declare_queue(name, auto_delete=False)
        got: list[bytes] = []

        async def handle(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            got.append(message.body)

        consumer = asyncio.create_task(bus.consume(name, handle, prefetch=1, mode="concurrent"))
        try:
            for _ in range(300):  # subscribed
                if (await queue.declare()).consumer_count:
                    break
                await asyncio.sleep(0.1)
            before = restarts(name)
            await queue.delete(if_unused=False, if_empty=False)  # the broker cancels the consumer
            for _ in range(300):
                if restarts(name) > before:
                    break
                await asyncio.sleep(0.1)
            assert restarts(name) > before, "not subscribed again within 30 s"
            # Subscribing again finds no queue until one is declared (in the product, by the
            # coordinators' watch); then the consumer gets what is published to it.
            queue = await channel.declare_queue(name, auto_delete=False)
            await bus.publish_raw("", name, aio_pika.Message(b"after", message_id="m1"))
            for _ in range(300):
                if got:
                    break
                await asyncio.sleep(0.1)
            assert got == [b"after"]
        finally:
            consumer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await consumer
            with contextlib.suppress(Exception):
                await queue.delete(if_unused=False, if_empty=False)
            await channel.close()
    await remove_namespace(settings)  # declared again by the consumer subscribing again
