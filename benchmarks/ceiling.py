"""The broker's own ceiling: persistent messages published with confirms to a quorum queue and
consumed, with nothing else on the path; from as many processes as the stack runs, each with its
own queue, all at once. ``python -m benchmarks.ceiling --messages M --processes P``"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
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


async def broker_ceiling(amqp_url: str, messages: int, processes: int) -> float:
    """Messages per second through the broker from ``processes`` processes at once (the sum of
    their rates: they start together and move the same number of messages each)."""
    if processes == 1:
        return await raw_broker_rate(amqp_url, messages)
    start_at = time.time() + 2.0  # every child imported and connected before any publishes
    argv = ["-m", "benchmarks.ceiling", "--messages", str(messages // processes),
            "--start-at", str(start_at)]  # fmt: skip
    env = {**os.environ, "SAGA_AMQP_URL": amqp_url}
    children = [
        await asyncio.create_subprocess_exec(
            sys.executable, *argv, env=env, stdout=asyncio.subprocess.PIPE
        )
        for _ in range(processes)
    ]
    outputs = [await child.communicate() for child in children]
    if any(child.returncode for child in children):
        raise RuntimeError("a ceiling process failed")
    return sum(float(out.decode()) for out, _ in outputs)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ceiling")
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--start-at", type=float, default=0.0, help="a time.time() to wait for")
    args = parser.parse_args()
    url = os.environ.get("SAGA_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
    if args.start_at:
        time.sleep(max(0.0, args.start_at - time.time()))
        print(asyncio.run(raw_broker_rate(url, args.messages)))
        return
    rate = asyncio.run(broker_ceiling(url, args.messages, args.processes))
    print(f"{rate:.0f} msgs/s from {args.processes} process(es)")


if __name__ == "__main__":
    main()
