"""Throughput on a three-node RabbitMQ cluster against a single node, side by side (by hand, or
in the benchmark's report with ``python -m benchmarks --cluster-rounds N``):

    python -m tests.chaos.cluster_speed [--sagas 1000] [--concurrency 64] [--rounds 3]

Each round runs the same refunds through the stack (in this process) on a single disposable
node and on a disposable three-node cluster (quorum queues on all three), alternating, every
guarantee on; sagas/s from the first start to the last outcome, pooled per side. Both sides'
nodes run with the same Erlang flags (``--erl-args``)."""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

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
    return "/".join(str(n) for n in led.values())


# The Erlang flags RabbitMQ's runtime guide gives for nodes that share their cores with other
# processes: schedulers that sleep when idle instead of spinning. Measured on 2026-12-07 (three
# rounds of 1,000 refunds at 64, each way): 0.79x with them and 0.79x without, so the nodes run
# with RabbitMQ's defaults and this stays for ``--erl-args``.
SHARED_CORES_ERL_ARGS = "+sbwt none +sbwtdcpu none +sbwtdio none"


@dataclass(frozen=True)
class ClusterSpeed:
    """Sagas/s per round on one node and on three, alternating (pooled: the mean of the rounds)."""

    sagas: int
    concurrency: int
    single: tuple[float, ...]
    cluster: tuple[float, ...]
    leaders: tuple[str, ...]  # per cluster round, how many quorum queues each node leads
    erl_args: str

    @property
    def ratio(self) -> float:
        return (sum(self.cluster) / len(self.cluster)) / (sum(self.single) / len(self.single))


async def compare(
    sagas: int, width: int, rounds: int, erl_args: str = "",
    say: Callable[[str], None] = print,
) -> ClusterSpeed:  # fmt: skip
    single: list[float] = []
    cluster: list[float] = []
    leaders: list[str] = []
    async with DisposablePostgres() as pg:
        for r in range(rounds):
            database = f"speed{r}"
            for side, results in (("single", single), ("cluster", cluster)):
                url = pg.url(f"{database}_{side}")
                await migrate(url)
                broker = (DisposableRabbit(erl_args=erl_args) if side == "single"
                          else RabbitCluster(erl_args=erl_args))  # fmt: skip
                namespace = f"sp{uuid.uuid4().hex[:6]}"
                async with broker:
                    rate = await measure(broker.url(), url, namespace,
                                         3 if side == "cluster" else 0, sagas, width)  # fmt: skip
                    led = await leaders_of(broker, namespace)
                results.append(rate)
                if led:
                    leaders.append(led)
                say(f"round {r + 1} {side:7s} {rate:6.1f} sagas/s"
                    + (f", leaders per node {led}" if led else ""))  # fmt: skip
    return ClusterSpeed(sagas, width, tuple(single), tuple(cluster), tuple(leaders), erl_args)


async def main(sagas: int, width: int, rounds: int, erl_args: str) -> None:
    speed = await compare(sagas, width, rounds, erl_args)
    one_node, three = (sum(x) / len(x) for x in (speed.single, speed.cluster))
    print(f"single node {one_node:.1f} sagas/s, three-node cluster {three:.1f} sagas/s: "
          f"{speed.ratio:.2f}x at concurrency {width}")  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.cluster_speed")
    parser.add_argument("--sagas", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--erl-args",
        default="",
        help="the nodes' Erlang flags, both sides (default: RabbitMQ's; "
        f"'{SHARED_CORES_ERL_ARGS}' for nodes sharing cores)",
    )
    args = parser.parse_args()
    asyncio.run(main(args.sagas, args.concurrency, args.rounds, args.erl_args))
