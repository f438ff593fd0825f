"""Throughput on a three-node RabbitMQ cluster against a single node, side by side (by hand):

    python -m tests.chaos.cluster_speed [--sagas 400] [--concurrency 32] [--rounds 2]

Each round runs the same refunds through the stack (in this process) on a single disposable
node and on a disposable three-node cluster (quorum queues on all three), alternating, every
guarantee on; sagas/s from the first start to the last outcome, pooled per side."""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid

from pydantic import JsonValue

from saga_app.stack import Stack
from saga_shared.client import SagaClient
from saga_shared.config import Settings
from saga_shared.storage.migrations import migrate
from saga_shared.transport.bus import Bus
from tests.chaos.cluster import RabbitCluster
from tests.chaos.instances import DisposablePostgres, DisposableRabbit

REFUND: dict[str, JsonValue] = {
    "sku": "SKU-1",
    "quantity": 1,
    "amount_cents": 1200,
    "customer_email": "a@example.com",
}


async def measure(
    amqp_url: str, database_url: str, namespace: str, quorum: int, sagas: int, width: int
) -> float:
    settings = Settings(amqp_url=amqp_url, database_url=database_url, namespace=namespace,
                        quorum_size=quorum, identity="shared")  # fmt: skip
    async with (
        Stack(settings, ["all"]),
        Bus(settings) as bus,
        SagaClient(bus, answer_within_s=60) as agent,
    ):
        gate = asyncio.Semaphore(width)

        async def one(n: int) -> None:
            async with gate:
                saga_id = await agent.start("refund", order_id=f"{namespace}-{n}", params=REFUND)
                await agent.wait(saga_id, seconds=120)

        await one(-1)  # warm-up: connections, prepared statements
        started = time.monotonic()
        await asyncio.gather(*(one(n) for n in range(sagas)))
        return sagas / (time.monotonic() - started)


async def leaders_of(broker: DisposableRabbit | RabbitCluster, namespace: str) -> str:
    """On the cluster, how many of the namespace's quorum queues each node leads: the share of
    the work each node does depends on it."""
    if not isinstance(broker, RabbitCluster):
        return ""
    led = await broker.leaders_per_node(f"{namespace}.")
    return ", leaders per node " + "/".join(str(n) for n in led.values())


async def main(sagas: int, width: int, rounds: int) -> None:
    single: list[float] = []
    cluster: list[float] = []
    async with DisposablePostgres() as pg:
        for r in range(rounds):
            database = f"speed{r}"
            for side, results in (("single", single), ("cluster", cluster)):
                url = pg.url(f"{database}_{side}")
                await migrate(url)
                broker = DisposableRabbit() if side == "single" else RabbitCluster()
                namespace = f"sp{uuid.uuid4().hex[:6]}"
                async with broker:
                    rate = await measure(broker.url(), url, namespace,
                                         3 if side == "cluster" else 0, sagas, width)  # fmt: skip
                    led = await leaders_of(broker, namespace)
                results.append(rate)
                print(f"round {r + 1} {side:7s} {rate:6.1f} sagas/s{led}", flush=True)
    one_node, three = sum(single) / len(single), sum(cluster) / len(cluster)
    print(f"single node {one_node:.1f} sagas/s, three-node cluster {three:.1f} sagas/s: "
          f"{three / one_node:.2f}x at concurrency {width}")  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.cluster_speed")
    parser.add_argument("--sagas", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    asyncio.run(main(args.sagas, args.concurrency, args.rounds))
