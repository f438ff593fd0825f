"""Small helpers for integration tests: waiting for a condition, publishing as an agent."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit, urlunsplit

import asyncpg
from pydantic import JsonValue

from saga_app.stack import Stack
from saga_coordinator.register import SagaState
from saga_shared.config import Settings
from saga_shared.model.messages import StartSaga
from saga_shared.storage.migrations import drop_database, migrate
from saga_shared.transport.bus import Bus
from saga_shared.transport.topology import partition_of

T = TypeVar("T")


@contextlib.asynccontextmanager
async def own_database(server_url: str, prefix: str) -> AsyncIterator[str]:
    """A new database on ``server_url``'s server, migrated, dropped afterwards: its URL."""
    parts = urlsplit(server_url)
    url = urlunsplit(parts._replace(path=f"/{prefix}_{uuid.uuid4().hex[:8]}"))
    await migrate(url)
    try:
        yield url
    finally:
        await drop_database(url)


REFUND: dict[str, JsonValue] = {
    "sku": "SKU-1",
    "quantity": 2,
    "amount_cents": 4999,
    "customer_email": "a@example.com",
}


async def eventually(
    probe: Callable[[], Awaitable[T]], check: Callable[[T], bool], *, seconds: float = 30
) -> T:
    """Poll ``probe`` until ``check`` holds; fail with the last value seen."""
    deadline = asyncio.get_running_loop().time() + seconds
    while True:
        value = await probe()
        if check(value):
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not met within {seconds}s; last value: {value!r}")
        await asyncio.sleep(0.05)


async def publish_start(bus: Bus, order_id: str, saga_id: str | None = None) -> str:
    """Fire and forget, as an agent that does not wait for replies."""
    command = StartSaga(
        saga_id=saga_id or f"s-{uuid.uuid4().hex[:10]}",
        order_id=order_id,
        saga="refund",
        params=REFUND,
    )
    await bus.publish(bus.topology.commands_exchange, command.type, command)
    return command.saga_id


async def saga_status(stack: Stack, saga_id: str) -> str | None:
    state = await stack.store.get(saga_id)
    return None if state is None else state.status


async def terminal(stack: Stack, saga_id: str, seconds: float = 30) -> SagaState:
    await eventually(
        lambda: saga_status(stack, saga_id),
        lambda s: s in ("completed", "compensated", "resolved", "needs_human"),
        seconds=seconds,
    )
    state = await stack.store.get(saga_id)
    assert state is not None
    return state


def same_partition_order(order_id: str, partitions: int) -> str:
    """Another order routed to the same partition as ``order_id``."""
    target = partition_of(order_id, partitions)
    while True:
        other = f"order-{uuid.uuid4().hex[:10]}"
        if other != order_id and partition_of(other, partitions) == target:
            return other


def ran_one_after_another(first: SagaState, second: SagaState) -> bool:
    """The second saga's first action started only after the first saga had finished."""
    started = [s.started_at for s in second.steps if s.started_at is not None]
    return first.finished_at is not None and bool(started) and min(started) >= first.finished_at


def saga_env(settings: Settings) -> dict[str, str]:
    """The environment that points a `saga` process at this test's broker, database and queues."""
    return {
        **os.environ,
        "SAGA_AMQP_URL": settings.amqp_url,
        "SAGA_DATABASE_URL": settings.database_url,
        "SAGA_NAMESPACE": settings.namespace,
        "SAGA_PARTITIONS": str(settings.partitions),
        "SAGA_DELIVERY_LIMIT": str(settings.delivery_limit),
        "SAGA_CATALOG_PATH": str(settings.catalog_file),
        "SAGA_WATCHDOG_S": str(settings.watchdog_s),
        "SAGA_PARTITION_LEASE_S": str(settings.partition_lease_s),
        "SAGA_STANDBY_AFTER_S": str(settings.standby_after_s),
        "SAGA_COORDINATOR_SHARE": settings.coordinator_share,
        "SAGA_IDENTITY": settings.identity,
        "SAGA_HANDOFF": settings.handoff,
        "SAGA_SECRETS_DIR": settings.secrets_dir,
        "SAGA_USER_PREFIX": settings.user_prefix,
        "SAGA_PEOPLE": settings.people,
        "SAGA_ACT_AS": settings.act_as,
        "SAGA_HEARTBEAT_S": str(settings.heartbeat_s),
        "SAGA_LOG_LEVEL": "WARNING",
    }


async def consumers_of(bus: Bus, queue_name: str) -> int:
    """How many consumers a queue has now (0 when it does not exist)."""
    depth = (await bus.depths([queue_name]))[queue_name]
    return depth.consumers if depth is not None else 0


async def remove_namespace(settings: Settings) -> None:
    """Delete a test's queues and exchanges, and the outbox rows addressed to them: no relay can
    deliver those once the exchanges are gone, and the next test's relay would bury them as
    unroutable dead letters (a coordinator killed by a test may leave some behind)."""
    async with Bus(settings) as bus:
        channel = await bus.connection.channel()
        try:
            await bus.topology.delete(channel)
        finally:
            await channel.close()
    await forget_outbox(settings)


async def forget_outbox(settings: Settings) -> None:
    """Drop the outbox rows addressed to a test's namespace (see ``remove_namespace``)."""
    prefix = f"{settings.namespace}."
    conn = await asyncpg.connect(settings.database_url)
    try:
        await conn.execute("DELETE FROM outbox WHERE left(exchange, length($1)) = $1", prefix)
    finally:
        await conn.close()


def quick(settings: Settings, tmp_path: Path) -> Settings:
    """The shipped catalog with one-attempt, 0.2 s calls: a step's deadline comes 2.2 s after its
    request, so tests of deadlines and resends take seconds."""
    text = Path(settings.catalog_file).read_text()
    text = re.sub(r"timeout_s = [0-9.]+", "timeout_s = 0.2", text)
    text = re.sub(r"attempts = \d+", "attempts = 1", text)
    path = tmp_path / "catalog.toml"
    path.write_text(text)
    return settings.with_(catalog_path=str(path), deadline_poll_s=0.1)


class Processes:
    """`saga run <component>` processes of one test, stopped at the end."""

    def __init__(self, settings: Settings, logs: Path) -> None:
        self.settings = settings
        self.logs = logs
        self.running: list[asyncio.subprocess.Process] = []

    async def start(
        self, component: str, crash_at: str | None = None, **more: str
    ) -> asyncio.subprocess.Process:
        """``more``: environment variables of this process only (``SAGA_LOG_LEVEL="INFO"``)."""
        env = {**saga_env(self.settings), **more}
        if crash_at is not None:
            env["SAGA_CRASH_POINT"] = crash_at
        log = (self.logs / f"{component}-{len(self.running)}.log").open("wb")
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "saga_app.cli", "run", component,
            env=env, stdout=log, stderr=log,
        )  # fmt: skip
        self.running.append(proc)
        return proc

    async def stop_all(self) -> None:
        for proc in self.running:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.running:
            try:
                await asyncio.wait_for(proc.wait(), 40)
            except TimeoutError:
                proc.kill()
