"""Runs the chosen components in this process: the same objects the CLI and the tests use."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from types import TracebackType

import asyncpg

from saga_coordinator.coordinator import Coordinator
from saga_coordinator.dead_letters import DeadLetterIngester
from saga_coordinator.intake import Intake
from saga_coordinator.relay import Relay
from saga_coordinator.store import Store
from saga_coordinator.timer import DeadlineTimer
from services.adapter import Adapter
from shared.bus import Bus
from shared.catalog import Catalog, load_catalog
from shared.config import Settings
from shared.sql import create_pool
from shared.topology import SERVICES

log = logging.getLogger(__name__)
COMPONENTS: tuple[str, ...] = ("coordinator", *SERVICES)


class Stack:
    """``async with Stack(settings, ["all"]) as stack: await stack.wait()``"""

    def __init__(self, settings: Settings, components: Iterable[str] = ("all",)) -> None:
        chosen = set(components)
        if "all" in chosen:
            chosen = set(COMPONENTS)
        unknown = chosen - set(COMPONENTS)
        if unknown:
            raise ValueError(f"unknown component(s) {sorted(unknown)}; choose from {COMPONENTS}")
        self.settings = settings
        self.components = [c for c in COMPONENTS if c in chosen]
        self.catalog: Catalog = load_catalog(settings.catalog_file)
        self.bus = Bus(settings)
        self._pool: asyncpg.Pool | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._relay: Relay | None = None
        self.coordinator: Coordinator | None = None

    @property
    def pool(self) -> asyncpg.Pool:
        if self._pool is None:
            raise RuntimeError("Stack is not started")
        return self._pool

    @property
    def store(self) -> Store:
        return Store(self.pool)

    async def __aenter__(self) -> Stack:
        await self.start()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    async def start(self) -> None:
        self._pool = await create_pool(self.settings.database_url, min_size=1, max_size=10)
        await self.bus.connect()
        await self.bus.declare()
        store = Store(self._pool, db_retry_s=self.settings.db_retry_s)
        runners = []
        if "coordinator" in self.components:
            runners.append(("intake", Intake(self.settings, self.catalog, self.bus, store).run()))
            self.coordinator = Coordinator(self.settings, self.catalog, self.bus, store)
            runners.append(("coordinator", self.coordinator.run()))
            self._relay = Relay(self.settings, self._pool, self.bus)
            runners.append(("relay", self._relay.run()))
            ingester = DeadLetterIngester(self.settings, self.bus, store)
            runners.append(("dead-letters", ingester.run()))
            timer = DeadlineTimer(self.settings, store, self.bus.topology)
            runners.append(("deadlines", timer.run()))
        for service in SERVICES:
            if service in self.components:
                adapter = Adapter(
                    service, self.settings, self.catalog, self.bus, self._pool,
                    db_retry_s=self.settings.db_retry_s,
                )  # fmt: skip
                runners.append((service, adapter.run()))
        self._tasks = [asyncio.create_task(coro, name=name) for name, coro in runners]
        log.info("started %s", ", ".join(self.components))

    @staticmethod
    async def _cancel(tasks: list[asyncio.Task[None]]) -> None:
        for task in tasks:
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        for task, result in zip(tasks, results, strict=True):
            if isinstance(result, Exception):
                log.error("%s stopped with %r", task.get_name(), result)

    async def wait(self) -> None:
        """Return when any component stops (it should not): its error is raised here."""
        done, _ = await asyncio.wait(self._tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            task.result()

    async def stop(self) -> None:
        """Consumers first (each finishes the message in hand), then one last outbox flush, so
        what they committed is published now rather than by whichever relay runs next."""
        consumers = [t for t in self._tasks if t.get_name() != "relay"]
        await self._cancel(consumers)
        if self._relay is not None:
            try:
                await asyncio.wait_for(self._relay.drain(), self.settings.stop_grace_s)
            except Exception as exc:  # the next relay to run publishes what is left
                log.warning("outbox not drained at stop: %r", exc)
        await self._cancel([t for t in self._tasks if t not in consumers])
        self._tasks = []
        self._relay = None
        await self.bus.close()
        if self._pool is not None:
            await self._pool.close()
            self._pool = None
