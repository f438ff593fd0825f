"""Per-order ordering under load, with two coordinator processes competing for the partitions."""

from __future__ import annotations

import asyncio
import itertools
import signal
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from saga_coordinator.app import Stack
from saga_coordinator.register import SagaState
from shared.bus import Bus
from shared.config import Settings
from shared.messages import AbortSaga, AnyCommand, StartSaga
from tests.integration.helpers import REFUND, eventually, remove_namespace, saga_env

ORDERS = 200


@pytest.fixture
async def two_coordinators(
    settings: Settings, tmp_path: Path
) -> AsyncIterator[list[asyncio.subprocess.Process]]:
    """Two real `saga run coordinator` processes, beside in-process adapters."""
    adapters = Stack(settings, ["inventory", "erp", "payments", "email"])
    await adapters.start()
    env = saga_env(settings)
    procs = []
    for n in range(2):
        log = (tmp_path / f"coordinator-{n}.log").open("wb")
        procs.append(
            await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "saga_coordinator.cli",
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

        async def agent(order_id: str) -> None:
            for command in published[order_id]:  # one agent per order publishes in order
                await bus.publish(bus.topology.commands_exchange, command.type, command)

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
        assert by_order[order_id] == [c.message_id for c in published[order_id]], order_id

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
