"""What a single RabbitMQ node loses when it is SIGKILLed: an experiment on a disposable
broker (never the machine's), run by hand, its findings in docs/explanation/crash-safety.md.

    .venv/bin/python -m tests.chaos.quorum_loss

Per trial: declare a quorum queue, wait (its age), publish N persistent messages each
confirmed by the broker, wait again, SIGKILL the node, restart it, and count what the queue
holds.
"""

from __future__ import annotations

import asyncio
import time

import aio_pika

from tests.chaos.instances import DisposableRabbit

# (the queue's age when publishing starts, the wait between the last confirm and the kill)
TRIALS = ((0.0, 0.0), (0.0, 1.0), (0.0, 2.0), (5.0, 0.0), (5.0, 0.2), (10.0, 0.0), (10.0, 1.0))
N = 200


async def trial(rabbit: DisposableRabbit, name: str, age: float, after: float) -> int:
    connection = await aio_pika.connect(rabbit.url())
    channel = await connection.channel(publisher_confirms=True)
    await channel.declare_queue(name, durable=True, arguments={"x-queue-type": "quorum"})
    await asyncio.sleep(age)
    for i in range(N):
        message = aio_pika.Message(f"m{i}".encode(), delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
        await channel.default_exchange.publish(message, name)  # returns once confirmed
    await asyncio.sleep(after)
    await connection.close()
    await rabbit.crash()  # SIGKILL
    await rabbit.restart()
    connection = await aio_pika.connect(rabbit.url())
    try:
        channel = await connection.channel()
        queue = await channel.declare_queue(name, passive=True)
        return int(queue.declaration_result.message_count or 0)
    finally:
        await connection.close()


async def main() -> None:
    async with DisposableRabbit() as rabbit:
        version = (await rabbit.ctl("version")).strip()
        print(f"RabbitMQ {version}, one node; {N} confirmed persistent messages per trial")
        for i, (age, after) in enumerate(TRIALS):
            started = time.monotonic()
            kept = await trial(rabbit, f"loss-{i}", age, after)
            print(
                f"queue {age:4.1f}s old, SIGKILL {after:3.1f}s after the last confirm: "
                f"{kept:3d} of {N} kept ({time.monotonic() - started:.1f}s)"
            )


if __name__ == "__main__":
    asyncio.run(main())
