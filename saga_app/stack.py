"""Runs the chosen components in this process: the same objects the CLI and the tests use."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Collection, Coroutine, Iterable
from types import TracebackType
from typing import Any, cast

import asyncpg

from saga_app.console.runner import ConsoleRunner
from saga_app.console.settings import ConsoleSettings
from saga_app.entry import version
from saga_coordinator.coordinator import Coordinator
from saga_coordinator.dead_letters import DeadLetterIngester
from saga_coordinator.desk import DeadLetterDesk
from saga_coordinator.gauges import keep_gauges
from saga_coordinator.intake import Intake
from saga_coordinator.relay import Relay
from saga_coordinator.store import Store
from saga_coordinator.timer import DeadlineTimer
from saga_services.adapter import Adapter
from saga_services.payments_http.api import bound_socket
from saga_services.payments_http.api import serve as serve_payments_api
from saga_services.registry import SYSTEMS, VARIANTS, load_service
from saga_services.sdk import Service
from saga_shared.config import Settings
from saga_shared.errors import ConfigError
from saga_shared.model.catalog import Catalog
from saga_shared.model.gateway import load_catalog
from saga_shared.security.identity import Component, Directory, check_connects_as, database_url_for
from saga_shared.storage.presence import Kind, Presence
from saga_shared.storage.sql import create_pool
from saga_shared.transport.bus import Bus

log = logging.getLogger(__name__)
# Besides these, a component may be a service of one's own, as ``package.module:attribute``.
COMPONENTS: tuple[str, ...] = ("coordinator", *SYSTEMS, *VARIANTS, "payments-api", "console")
_NOT_SERVICES = ("coordinator", "payments-api", "console")


class Stack:
    """``async with Stack(settings, ["all"]) as stack: await stack.wait()``

    In ``roles`` mode each component connects to RabbitMQ and Postgres as its own role (the
    coordinator's parts as the coordinator, each adapter as its service), so even components
    sharing this process are told apart by the broker and the database."""

    def __init__(
        self,
        settings: Settings,
        components: Iterable[str] = ("all",),
        console: ConsoleSettings | None = None,
        services: Iterable[Service[Any]] = (),
    ) -> None:
        """``console``: the console's settings; with ``all``, the console runs when they name an
        accounts file; ``services``: services of one's own, as objects (the test harness)."""
        self.settings = settings
        self.catalog: Catalog = load_catalog(settings.catalog_file)
        chosen = [c for c in dict.fromkeys(components) if c != "all"]
        self.services: dict[str, Service[Any]] = {
            c: load_service(c) for c in chosen if c not in _NOT_SERVICES
        }
        self.services |= {s.name: s for s in services}
        chosen += [s.name for s in services if s.name not in chosen]
        if "all" in components:  # the coordinator, and a built-in adapter per service left
            taken = {s.name for s in self.services.values()}
            needed = [s for s in SYSTEMS if s in self.catalog.services and s not in taken]
            self.services |= {s: SYSTEMS[s] for s in needed}
            chosen = list(dict.fromkeys(["coordinator", *needed, *chosen]))
            if console is not None and console.users:
                chosen.append("console")
            elif console is not None:
                log.warning("console not started: no SAGA_CONSOLE_USERS accounts file "
                            "(create one with `saga console-user`)")  # fmt: skip
        self.components = chosen
        self.console_runner: ConsoleRunner | None = None
        if "console" in chosen:  # the accounts file is read now: a bad one is an error at once
            self.console_runner = ConsoleRunner(console or ConsoleSettings(), self.catalog)
        self._check_services()
        self.directory = Directory.from_settings(settings)
        self._shared = settings.identity == "shared"
        first = cast(
            Component,
            "coordinator"
            if "coordinator" in chosen or not self.services
            else next(iter(self.services.values())).name,
        )
        self.bus = Bus(settings, user=self.directory.user(first))
        if settings.handoff == "in-process":  # one account: the settings refuse it in roles
            self.bus.hand_over()
        self._buses: dict[str, Bus] = {"shared" if self._shared else first: self.bus}
        self._pools: dict[str, asyncpg.Pool] = {}
        self._own_pools: list[asyncpg.Pool] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._relay: Relay | None = None
        self.coordinator: Coordinator | None = None

    def _check_services(self) -> None:
        served: dict[str, str] = {}
        for component, service in self.services.items():
            if service.name in served:
                raise ConfigError(
                    f"{component} and {served[service.name]} both serve {service.name!r}: "
                    "run one of them"
                )
            served[service.name] = component
            service.check(self.catalog)

    @property
    def pool(self) -> asyncpg.Pool:
        pool = next(iter(self._pools.values()), None)
        if pool is None:
            raise RuntimeError("Stack is not started")
        return pool

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

    async def _connect(self, role: Component) -> tuple[Bus, asyncpg.Pool]:
        """The bus and pool a component of ``role`` works through (one of each for everything
        in shared mode)."""
        key = "shared" if self._shared else role
        if key not in self._pools:
            check_connects_as(self.settings, self.directory.user(role), f"the {role} component")
            size = 10 if role == "coordinator" or self._shared else 5
            url = database_url_for(self.settings, role)
            self._pools[key] = await create_pool(
                url, min_size=1, max_size=size, plan_cache_mode=self.settings.db_plan_cache_mode,
                idle_in_transaction_s=self.settings.lease_s,
            )  # fmt: skip
        bus = self._buses.setdefault(key, Bus(self.settings, user=self.directory.user(role)))
        if not bus.connected:
            await bus.connect()
        return bus, self._pools[key]

    async def start(self) -> None:
        runners = []
        if "coordinator" in self.components:
            bus, pool = await self._connect("coordinator")
            await bus.declare()  # the coordinator owns the topology
            runners += self._coordinator_parts(bus, pool)
        for component, service in self.services.items():
            bus, pool = await self._connect(cast(Component, service.name))
            if self._shared and "coordinator" not in self.components:
                await bus.declare(requests=False)  # the coordinator's to declare and watch
            adapter = Adapter(
                service, self.settings, self.catalog, bus, pool,
                db_retry_s=self.settings.db_retry_s,
            )  # fmt: skip
            runners.append((component, adapter.run()))
            topology = bus.topology
            queues = [topology.action_queue(service.name), topology.request_queue(service.name)]
            runners.append((f"{component}-heartbeat", self._beats(pool, "adapter", service.name,
                                                                 queues)))  # fmt: skip
        if "payments-api" in self.components:
            runners.append(("payments-api", await self._payments_api()))
        if self.console_runner is not None:
            runners.append(("console", await self._console_part(self.console_runner)))
        self._tasks = [asyncio.create_task(coro, name=name) for name, coro in runners]
        if self._shared:
            log.warning("SAGA_IDENTITY=shared: one broker account for everything; senders are "
                        "not verified (a development setting)")  # fmt: skip
        log.info("started %s", ", ".join(self.components))

    def _beats(
        self, pool: asyncpg.Pool, kind: Kind, name: str, queues: list[str],
        holding: Callable[[], Collection[int]] | None = None,
    ) -> Coroutine[Any, Any, None]:  # fmt: skip
        presence = Presence(pool, self.settings.namespace, kind, name, queues, version(),
                            self.settings.heartbeat_s, holding)  # fmt: skip
        return presence.run()

    async def _payments_api(self) -> Coroutine[Any, Any, None]:
        """The HTTP payments API (an external system in the demo): its socket bound now, so a
        port in use is an error at start."""
        sock = bound_socket(self.settings.payments_api_bind)
        pool = await create_pool(self.settings.database_url, min_size=1, max_size=10)
        self._own_pools.append(pool)
        return serve_payments_api(pool, sock)

    async def _console_part(self, console: ConsoleRunner) -> Coroutine[Any, Any, None]:
        """The console reads as the read-only role and acts as the console's broker account."""
        console.bind()
        key = "shared" if self._shared else "console"
        user = self.directory.user("console")
        check_connects_as(self.settings, user, "the console")
        bus = self._buses.setdefault(key, Bus(self.settings, user=user))
        if not bus.connected:
            await bus.connect()
        url = database_url_for(self.settings, "reader")
        pool = await create_pool(url, min_size=1, max_size=5)
        self._own_pools.append(pool)
        return console.run(bus, pool)

    def _coordinator_parts(
        self, bus: Bus, pool: asyncpg.Pool
    ) -> list[tuple[str, Coroutine[Any, Any, None]]]:
        store = Store(
            pool, db_retry_s=self.settings.db_retry_s, guarded=self.settings.guarded_apply
        )
        self.coordinator = coordinator = Coordinator(self.settings, self.catalog, bus, store)
        desk = DeadLetterDesk(store, self.coordinator.processor)
        url = database_url_for(self.settings, "coordinator")
        self._relay = Relay(self.settings, pool, bus, url, recover=self.coordinator.watch.recover)
        topology = bus.topology
        coordinator_queues = [
            topology.intake_queue,
            topology.dead_letter_queue,
            *(topology.partition_queue(i) for i in range(topology.partitions)),
        ]
        beats = self._beats(pool, "coordinator", "coordinator", coordinator_queues,
                            lambda: coordinator.ownership.held)  # fmt: skip
        return [
            ("intake", Intake(self.settings, self.catalog, bus, store, desk).run()),
            ("coordinator", self.coordinator.run()),
            ("relay", self._relay.run()),
            (
                "dead-letters",
                DeadLetterIngester(
                    self.settings, bus, store, self.coordinator.processor.release
                ).run(),
            ),
            ("deadlines", DeadlineTimer(self.settings, store, bus.topology).run()),
            (
                "gauges",
                keep_gauges(
                    pool,
                    self.settings.metrics_poll_s,
                    self.settings.namespace,
                    self.settings.heartbeat_s,
                ),
            ),
            ("heartbeat", beats),
        ]

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
        if self.coordinator is not None:
            with contextlib.suppress(Exception):  # else the relay republishes them: duplicates
                await self.coordinator.forget_published()
        if self._relay is not None:
            try:
                await asyncio.wait_for(self._relay.drain(), self.settings.stop_grace_s)
            except Exception as exc:  # the next relay to run publishes what is left
                log.warning("outbox not drained at stop: %r", exc)
        await self._cancel([t for t in self._tasks if t not in consumers])
        self._tasks = []
        self._relay = None
        for bus in {id(b): b for b in self._buses.values()}.values():
            await bus.close()
        for pool in [*self._pools.values(), *self._own_pools]:
            await pool.close()
        self._pools, self._own_pools = {}, []
        if self.console_runner is not None:
            self.console_runner.close()
