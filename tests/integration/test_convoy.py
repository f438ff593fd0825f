"""Per-order ordering under load, with two coordinator processes competing for the partitions."""

from __future__ import annotations

import asyncio
import itertools
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import asyncpg
import pytest
from aio_pika.abc import AbstractIncomingMessage

from saga_app.stack import Stack
from saga_coordinator.register import SagaState
from saga_shared.client import SagaClient
from saga_shared.config import Settings
from saga_shared.model.messages import AbortSaga, AnyCommand, StartSaga
from saga_shared.security.trust import forwarded_id
from saga_shared.transport.bus import Bus
from saga_shared.transport.topology import partition_of
from tests.integration.helpers import REFUND, eventually, remove_namespace, saga_env, terminal

ORDERS = 200


@pytest.fixture
async def two_coordinators(
    settings: Settings, tmp_path: Path
) -> AsyncIterator[list[asyncio.subprocess.Process]]:
    """Two real `saga run coordinator` processes splitting the partitions, beside in-process
    adapters."""
    adapters = Stack(settings, ["inventory", "erp", "payments", "email"])
    await adapters.start()
    procs = []
    for n in range(2):
        # each takes half the partitions and stands by for the other half
        env = {**saga_env(settings), "SAGA_COORDINATOR_SHARE": f"{n}/2"}
        log = (tmp_path / f"coordinator-{n}.log").open("wb")
        procs.append(
            await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "saga_app.cli",
                "run",
                "coordinator",
                env=env,
                stdout=log,
                stderr=log,
            )
        )
    try:
        yield procs
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                await asyncio.wait_for(proc.wait(), 20)
            except TimeoutError:
                proc.kill()
        await adapters.stop()
        await remove_namespace(settings)


def commands_for(order_id: str) -> list[AnyCommand]:
    a, b, c = (f"{order_id}-{x}" for x in "abc")
    start = {"order_id": order_id, "saga": "refund", "params": REFUND}
    return [
        StartSaga(saga_id=a, **start),
        StartSaga(saga_id=b, **start),
        AbortSaga(saga_id=a, order_id=order_id, reason="changed my mind"),
        StartSaga(saga_id=c, **start),
        AbortSaga(saga_id=c, order_id=order_id, reason="duplicate order"),
    ]


async def test_per_order_handling_order_equals_publish_order(
    settings: Settings, pool: asyncpg.Pool, two_coordinators: list[asyncio.subprocess.Process]
) -> None:
    run = uuid.uuid4().hex[:6]
    orders = [f"convoy-{run}-{i}" for i in range(ORDERS)]
    published = {o: commands_for(o) for o in orders}

    async with Bus(settings) as bus:
        sender = bus.user or ""

        async def agent(order_id: str) -> None:
            # One agent per order publishes in order: half of them straight to the order's
            # partition (what the client does), half under the bare type, through the intake.
            direct = orders.index(order_id) % 2 == 0
            for command in published[order_id]:
                key = bus.topology.command_key(command.type, order_id) if direct else command.type
                await bus.publish(bus.topology.commands_exchange, key, command)

        await asyncio.gather(*(agent(o) for o in orders))

    sagas = 3 * ORDERS
    await eventually(
        lambda: pool.fetchval(
            "SELECT count(*) FROM sagas WHERE order_id = ANY($1)"
            " AND status IN ('completed', 'compensated')",
            orders,
        ),
        lambda done: done == sagas,
        seconds=240,
    )
    # A late abort (its saga already finished) is still handled: wait for every command.
    query = (
        "SELECT order_id, message_id FROM saga_log WHERE order_id = ANY($1) AND seq IS NOT NULL"
        " AND message_type LIKE 'saga.%' ORDER BY order_id, seq"
    )
    handled = await eventually(
        lambda: pool.fetch(query, orders), lambda rows: len(rows) == 5 * ORDERS, seconds=60
    )
    assert all(p.returncode is None for p in two_coordinators), "a coordinator died"
    by_order: dict[str, list[str]] = {}
    for row in handled:
        by_order.setdefault(row["order_id"], []).append(row["message_id"])
    for order_id in orders:
        # the intake forwards each command under an id of its own, derived from the sender's
        expected = [forwarded_id(sender, c.message_id) for c in published[order_id]]
        assert by_order[order_id] == expected, order_id

    rows = await pool.fetch(
        "SELECT state::text FROM sagas WHERE order_id = ANY($1) ORDER BY order_id, arrival", orders
    )
    states = [SagaState.model_validate_json(r[0]) for r in rows]
    for order_id in orders:
        ran = [s for s in states if s.order_id == order_id and any(x.started_at for x in s.steps)]
        for earlier, later in itertools.pairwise(ran):
            began = min(x.started_at for x in later.steps if x.started_at is not None)
            assert earlier.finished_at is not None
            assert began >= earlier.finished_at, f"{later.saga_id} overlaps {earlier.saga_id}"


async def test_coordinators_split_the_partitions_and_stand_by_for_each_other(
    settings: Settings,
) -> None:
    quick = settings.with_(standby_after_s=0.5)
    handled: dict[str, set[str]] = {"a": set(), "b": set()}
    stacks = {
        name: Stack(quick.with_(coordinator_share=share), ["coordinator"])
        for name, share in (("a", "0/2"), ("b", "1/2"))
    }
    adapters = Stack(quick, ["inventory", "erp", "payments", "email"])
    for name, stack in stacks.items():
        await stack.start()
        coordinator = stack.coordinator
        assert coordinator is not None
        coordinator.handle = recording(coordinator.handle, handled[name])  # type: ignore[method-assign,assignment]
    await adapters.start()
    try:
        await asyncio.sleep(1.0)  # both stand by for the other's partitions now
        await run_one_saga_per_partition(stacks["a"], quick)
        assert handled == {"a": {"0", "2"}, "b": {"1", "3"}}

        await stacks["a"].stop()  # b's standby consumers take a's partitions
        handled["b"].clear()
        await run_one_saga_per_partition(stacks["b"], quick)
        assert handled["b"] == {"0", "1", "2", "3"}
    finally:
        for stack in (*stacks.values(), adapters):
            await stack.stop()
        await remove_namespace(quick)


def recording(
    handle: Callable[[AbstractIncomingMessage, int], Awaitable[None]], seen: set[str]
) -> Callable[[AbstractIncomingMessage, int], Awaitable[None]]:
    async def wrapped(delivery: AbstractIncomingMessage, partition: int) -> None:
        seen.add(str(partition))
        await handle(delivery, partition)

    return wrapped


async def run_one_saga_per_partition(stack: Stack, settings: Settings) -> None:
    orders: dict[int, str] = {}
    while len(orders) < settings.partitions:
        order_id = f"order-{uuid.uuid4().hex[:10]}"
        orders.setdefault(partition_of(order_id, settings.partitions), order_id)
    async with Bus(settings) as bus, SagaClient(bus) as agent:
        sagas = [await agent.start("refund", order_id=o, params=REFUND) for o in orders.values()]
        for saga in sagas:
            assert (await terminal(stack, saga)).status == "completed"
