"""Your sagas in the deterministic simulation, or the same test against the real stack.

    from saga_app.simkit import SagaHarness   # or the pytest fixture ``sagas`` (below)

    async def test_a_pick_that_hangs_is_undone(sagas: SagaHarness) -> None:
        sagas.fail("warehouse.pick", "hang")
        saga_id = await sagas.start("pick_and_ship", order_id="o-1", params={...})
        state = await sagas.reaches(saga_id, "compensated", within=300)
        await sagas.published("saga.compensated", saga_id)

In the simulation (the default) the test runs on the virtual clock of ``saga_app.sim``: the
product's coordinator, adapter framework and key records over a simulated RabbitMQ (redeliveries,
delivery limits, dead letters, crashes) and an in-memory store, your services beside the
built-in simulated systems; waiting an hour takes no time, and a run is the same every time for
one ``seed``. ``crash``, ``freeze`` and ``crash_broker`` rehearse what a real deployment does to
a saga. With ``SAGA_TEST_STACK=real`` the same test runs against RabbitMQ and Postgres
(``SAGA_AMQP_URL``, ``SAGA_DATABASE_URL``): the stack in-process, your services in it, in a
namespace of its own, removed afterwards; there the simulation's own faults are not available.

The fixture: add ``pytest_plugins = ["saga_app.pytest_plugin"]`` to your ``conftest.py`` and
define ``saga_catalog`` (a path) and ``saga_services`` (your ``Service`` objects) fixtures.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

from pydantic import JsonValue

from saga_app.sim.adapters import AdapterProcess
from saga_app.sim.plan import Fault, Plan
from saga_app.sim.scripts import fault
from saga_app.sim.world import World
from saga_coordinator.register import SagaState
from saga_services.errors import Permanent, Transient
from saga_services.registry import SYSTEMS
from saga_services.sdk import Service
from saga_shared.client import CommandRejected
from saga_shared.model.catalog import Catalog
from saga_shared.model.gateway import load_catalog
from saga_shared.model.ids import random_id
from saga_shared.model.messages import (
    AbortSaga,
    ApproveSaga,
    CommandReply,
    RejectSaga,
    ResumeSaga,
    SagaEvent,
    SettleSaga,
    StartSaga,
)

T = TypeVar("T")
Statuses = str | Iterable[str]
FaultMode = Literal["permanent", "transient", "hang"]


class SagaHarness(Protocol):
    """What a test of one's sagas does, in the simulation or on the real stack."""

    async def start(self, saga: str, *, order_id: str, params: dict[str, JsonValue],
                    saga_id: str | None = None) -> str: ...  # fmt: skip

    async def abort(self, saga_id: str, *, reason: str) -> CommandReply: ...
    async def approve(self, saga_id: str, *, note: str = "") -> CommandReply: ...
    async def reject(self, saga_id: str, *, reason: str) -> CommandReply: ...
    async def resume(self, saga_id: str, *, note: str = "") -> CommandReply: ...
    async def settle(self, saga_id: str, *, happened: bool, note: str) -> CommandReply: ...

    async def reaches(self, saga_id: str, status: Statuses, *, within: float = 60.0) -> SagaState:
        """Wait until the saga's status is (one of) ``status``; ``AssertionError`` if it is not
        within ``within`` seconds (of the virtual clock in the simulation)."""

    async def published(self, event: str, saga_id: str | None = None, *,
                        within: float = 60.0) -> SagaEvent:  # fmt: skip
        """Wait until a lifecycle event of that type (of that saga) has been published."""

    async def register(self, saga_id: str) -> SagaState: ...

    def fail(self, action: str, mode: FaultMode, *, order_id: str | None = None,
             times: int | None = None) -> None:  # fmt: skip
        """The calls of ``action`` (of one order, or of all) fail: ``permanent``,
        ``transient`` (``times`` calls, then it works), ``hang`` (no answer)."""


class _Faults:
    """Faults of one's own services' calls, injected in front of their functions (the built-in
    simulated systems keep theirs in their tables)."""

    def __init__(self) -> None:
        self.by_action: dict[tuple[str, str | None], list[Any]] = {}

    def add(self, catalog: Catalog, action: str, mode: FaultMode, order_id: str | None,
            times: int | None) -> None:  # fmt: skip
        if action not in catalog.actions and action not in catalog.compensations:
            raise ValueError(f"unknown action {action!r}")
        self.by_action[(action, order_id)] = [mode, times]

    def take(self, action: str, order_id: str) -> str | None:
        found = self.by_action.get((action, order_id)) or self.by_action.get((action, None))
        if found is None or found[1] == 0:
            return None
        if found[1] is not None:
            found[1] -= 1
        return str(found[0])


class Simulation:
    """A ``SagaHarness`` in the deterministic simulation (``saga_app.sim``)."""

    def __init__(self, catalog: Catalog | Path | str, services: Sequence[Service[Any]] = (), *,
                 seed: int = 0, coordinators: int = 1) -> None:  # fmt: skip
        self.catalog = catalog if isinstance(catalog, Catalog) else load_catalog(Path(catalog))
        self.faults = _Faults()
        wrapped = served(self.catalog, services, self.faults)
        plan = Plan(seed=seed, sagas=(), coordinators=coordinators, email_processes=1)
        self.world = World(plan, catalog=self.catalog, services=wrapped)
        self.events: list[SagaEvent] = []

    async def __aenter__(self) -> Simulation:
        await self.world.start()
        self._listen()
        self.agent = self.world.sender("saga-agent-1")
        self.ana = self.world.sender("ana")
        self.ops = self.world.sender("saga-ops")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.world.stop()

    def _listen(self) -> None:
        broker, topology = self.world.broker, self.world.topology
        connection = broker.connect(user="saga-agent-1", name="test-listener")
        broker.declare_client_queue("test.events", owner=connection)
        broker.bind("test.events", topology.events_exchange, "#")

        async def heard(delivery: Any) -> None:
            self.events.append(SagaEvent.model_validate_json(delivery.body))
            await delivery.ack()

        connection.consume("test.events", heard)

    def fail(self, action: str, mode: FaultMode, *, order_id: str | None = None,
             times: int | None = None) -> None:  # fmt: skip
        self.faults.add(self.catalog, action, mode, order_id, times)

    # --- the world's own faults -------------------------------------------------------------

    def crash(self, process: str, *, for_s: float = 1.0) -> None:
        """Kill a process (``coordinator-0``, ``<service>-0``); it comes back ``for_s`` later."""
        target = self.world.processes[process]
        target.stop("killed")

        async def back() -> None:
            await asyncio.sleep(for_s)
            await (target.start() if isinstance(target, AdapterProcess) else _sync(target))

        self.world.background(back())

    def freeze(self, service: str, *, for_s: float) -> None:
        target = self.world.processes[f"{service}-0"]
        assert isinstance(target, AdapterProcess)
        target.freeze()
        self.world.background(_later(for_s, target.thaw))

    def crash_broker(self, *, for_s: float = 2.0) -> None:
        self.world.background(fault(self.world, Fault(0.0, "broker", "", for_s)))

    # --- commands ---------------------------------------------------------------------------

    async def _send(self, sender: Any, command: Any) -> CommandReply:
        reply: CommandReply | None = await sender.send(command, patience_s=600.0)
        if reply is None:
            raise AssertionError(f"{command.type} was never answered")
        if reply.type == "command.rejected":
            raise CommandRejected(reply)
        return reply

    async def start(self, saga: str, *, order_id: str, params: dict[str, JsonValue],
                    saga_id: str | None = None) -> str:  # fmt: skip
        command = StartSaga(saga_id=saga_id or random_id(), order_id=order_id, saga=saga,
                            params=params)  # fmt: skip
        await self._send(self.agent, command)
        return command.saga_id

    async def _ids(self, saga_id: str) -> dict[str, Any]:
        return {"saga_id": saga_id, "order_id": (await self.register(saga_id)).order_id}

    async def abort(self, saga_id: str, *, reason: str) -> CommandReply:
        return await self._send(self.agent, AbortSaga(**await self._ids(saga_id), reason=reason))

    async def approve(self, saga_id: str, *, note: str = "") -> CommandReply:
        step = _gate(await self.register(saga_id))
        command = ApproveSaga(**await self._ids(saga_id), note=note, step=step)
        return await self._send(self.ana, command)

    async def reject(self, saga_id: str, *, reason: str) -> CommandReply:
        step = _gate(await self.register(saga_id))
        command = RejectSaga(**await self._ids(saga_id), reason=reason, step=step)
        return await self._send(self.ana, command)

    async def resume(self, saga_id: str, *, note: str = "") -> CommandReply:
        return await self._send(self.ops, ResumeSaga(**await self._ids(saga_id), note=note))

    async def settle(self, saga_id: str, *, happened: bool, note: str) -> CommandReply:
        state = await self.register(saga_id)
        step = next(s.index for s in state.steps if s.status == "in_doubt")
        command = SettleSaga(**await self._ids(saga_id), step=step, happened=happened, note=note,
                             version=state.version)  # fmt: skip
        return await self._send(self.ana, command)

    # --- what a test looks at ---------------------------------------------------------------

    async def register(self, saga_id: str) -> SagaState:
        state = self.world.saga(saga_id)
        if state is None:
            raise KeyError(f"no saga {saga_id!r}")
        return state

    async def reaches(self, saga_id: str, status: Statuses, *, within: float = 60.0) -> SagaState:
        wanted = {status} if isinstance(status, str) else set(status)
        return await _until(lambda: _state_if(self.world.saga(saga_id), wanted), within,
                            f"saga {saga_id} never reached {sorted(wanted)}",
                            lambda: _where(self.world.saga(saga_id)))  # fmt: skip

    async def published(self, event: str, saga_id: str | None = None, *,
                        within: float = 60.0) -> SagaEvent:  # fmt: skip
        def found() -> SagaEvent | None:
            return next((e for e in self.events if e.type == event
                         and saga_id in (None, e.saga_id)), None)  # fmt: skip

        return await _until(found, within, f"no {event} published for {saga_id or 'any saga'}",
                            lambda: str([e.type for e in self.events][-10:]))  # fmt: skip

    def deps(self, service: str) -> Any:
        """What the service's setup yielded (your fake system)."""
        return self.world.processes[f"{service}-0"].adapter._deps  # type: ignore[union-attr]


async def _sync(process: Any) -> None:
    process.start()


async def _later(seconds: float, then: Any) -> None:
    await asyncio.sleep(seconds)
    then()


def _gate(state: SagaState) -> int | None:
    return next((s.index for s in state.steps if s.gate_status == "waiting"), None)


def _state_if(state: SagaState | None, wanted: set[str]) -> SagaState | None:
    return state if state is not None and state.status in wanted else None


def _where(state: SagaState | None) -> str:
    if state is None:
        return "no such saga"
    return f"it is {state.status}: " + ", ".join(f"{s.action} {s.status}" for s in state.steps)


async def _until(
    found: Callable[[], T | None], within: float, what: str, where: Callable[[], str]
) -> T:
    loop = asyncio.get_running_loop()
    give_up = loop.time() + within
    while True:
        value = found()
        if value is not None:
            return value
        if loop.time() > give_up:
            raise AssertionError(f"{what} within {within:g}s ({where()})")
        await asyncio.sleep(0.05)


def served(
    catalog: Catalog, services: Sequence[Service[Any]], faults: _Faults
) -> list[Service[Any]]:
    """One's own services and the built-in simulated systems the catalog names, each behind
    the harness's faults."""
    own = {s.name for s in services}
    builtin = [s for name, s in SYSTEMS.items() if name in catalog.services and name not in own]
    return [_faulty(s, faults) for s in [*builtin, *services]]


def _faulty(service: Service[Any], faults: _Faults) -> Service[Any]:
    """The service, its calls first passing the harness's injected faults."""

    class Faulty(Service[Any]):
        async def call(self, req: Any, deps: Any, *, attempt: int = 1) -> Any:
            mode = faults.take(req.action, req.order_id)
            if mode == "permanent":
                raise Permanent(f"injected permanent fault on {req.action}")
            if mode == "transient":
                raise Transient(f"injected transient fault on {req.action}")
            if mode == "hang":
                await asyncio.get_running_loop().create_future()
            return await super().call(req, deps, attempt=attempt)

    wrapped = Faulty(service.name, status=service.status, atomic=service.atomic)
    wrapped._handlers, wrapped._setup = service._handlers, service._setup
    return wrapped


@contextlib.asynccontextmanager
async def on_the_real_stack(
    catalog: Path, services: Sequence[Service[Any]]
) -> AsyncIterator[SagaHarness]:
    """The same harness on RabbitMQ and Postgres (``saga_app.simkit_real``)."""
    from saga_app.simkit_real import RealStack

    async with RealStack(catalog, services) as real:
        yield real
