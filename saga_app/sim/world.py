"""One simulated run: the broker, the coordinator's database, the services' key records and
systems, the processes, the senders, and the plan's faults, on the virtual loop; then a quiet
spell in which every fault is healed, every process is up, dead letters are replayed and people
settle what waits for them, so that every saga must end. ``saga_app.sim.checks`` then holds the
run to the design's rules. Everything random is drawn from the plan's seed."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections import Counter
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from saga_app.sim import scripts
from saga_app.sim.adapters import AdapterProcess
from saga_app.sim.agents import Sender
from saga_app.sim.broker import Broker, BrokerConfig
from saga_app.sim.coordinator import CoordinatorProcess
from saga_app.sim.loop import now as virtual_now
from saga_app.sim.plan import Plan
from saga_app.sim.store import SimStore
from saga_app.sim.systems import Gateway, sim_catalog, sms_service
from saga_coordinator.dead_letters import Death, Judgement
from saga_coordinator.register import SagaState
from saga_services.keys import MemoryKeys
from saga_services.registry import SYSTEMS
from saga_services.sdk import Service
from saga_services.simulated_memory import MemorySystems
from saga_shared.config import Settings
from saga_shared.model.catalog import Catalog
from saga_shared.model.gateway import load_catalog
from saga_shared.model.messages import (
    ActionRequest,
    AnyCommand,
    CommandReply,
    PartitionMessage,
    QuerySaga,
)
from saga_shared.security.identity import Directory
from saga_shared.transport.codec import Identity
from saga_shared.transport.poison import MemoryCounter
from saga_shared.transport.topology import Topology


@dataclass(frozen=True)
class Users:
    prefix: str = "saga-"

    @property
    def coordinator(self) -> str:
        return f"{self.prefix}coordinator"

    def service(self, name: str) -> str:
        return f"{self.prefix}{name}"


@dataclass
class Letter:
    """A dead letter as the ingester stored it."""

    body: bytes
    headers: dict[str, Any]
    user: str | None
    message_id: str | None
    message_type: str | None
    exchange: str
    routing_key: str
    reason: str
    order_id: str | None
    blocks: bool
    replayed: bool = False


@dataclass
class Records:
    """What the run did, for the checks and the timeline (and, for the gatekeeper, the
    rejections it records and the registers it answers ``saga.status`` from)."""

    commands: dict[str, tuple[str, AnyCommand | QuerySaga]] = field(default_factory=dict)
    sends: Counter[str] = field(default_factory=Counter)
    answers: dict[str, list[CommandReply]] = field(default_factory=dict)
    calls: Counter[tuple[str, int]] = field(default_factory=Counter)  # (key, send) -> calls
    handled: list[tuple[float, str, str, str, str]] = field(default_factory=list)
    letters: list[Letter] = field(default_factory=list)
    rejections: list[tuple[str, str, str]] = field(default_factory=list)
    timeline: list[tuple[float, str, str]] = field(default_factory=list)
    store: SimStore | None = None
    forged: str | None = None  # the message id of the forged outcome the broker took

    async def record_rejection(self, ident: Identity, *, sender: str | None, rule: str,
                               reason: str, body: bytes, keep_bytes: int) -> None:  # fmt: skip
        self.rejections.append((ident.message_id, rule, reason))

    async def replayed_sender(self, header: object, message_id: str) -> tuple[bool, str | None]:
        return False, None  # the simulated operator replays as the first sender (see World)

    async def get(self, saga_id: str) -> SagaState | None:
        assert self.store is not None
        return self.store.memory.get(saga_id)


class World:
    def __init__(
        self, plan: Plan, *, partitions: int = 4, catalog: Catalog | None = None,
        services: Sequence[Service[Any]] = (),
    ) -> None:  # fmt: skip
        """``catalog`` and ``services``: a user's own (the built-in simulated systems serve
        whatever of theirs the catalog names); by default the shipped catalog, with an SMS
        gateway of one's own beside the built-in systems."""
        self.plan = plan
        self.rng = random.Random(plan.seed)
        self.users = Users()
        self.settings = Settings(
            identity="roles", partitions=partitions, people="ana,bo", agents="saga-agent-*",
            delivery_limit=5, user_prefix=self.users.prefix, events="*",
            agent_rate=1_000_000, agent_burst=1_000_000,  # the rate is not what is simulated
        )  # fmt: skip
        self.catalog = catalog or sim_catalog(load_catalog(Settings().catalog_file))
        self.topology = dataclasses.replace(
            Topology.from_settings(self.settings), declared_services=self.catalog.services
        )
        self.directory = Directory.from_settings(self.settings)
        self.broker = Broker(self.topology, random.Random(self.rng.random()), BrokerConfig(
            loss_window_s=1.0, loss_probability=0.3))  # fmt: skip
        self.store = SimStore(lambda: asyncio.get_running_loop().time())
        self.records = Records(store=self.store)
        self.systems = MemorySystems(virtual_now)
        self.gateway = Gateway()
        served = {s.name: s for s in services} if catalog is not None else {
            "sms": sms_service(self.gateway, status=plan.text_status_hook)}  # fmt: skip
        served = {**{n: s for n, s in SYSTEMS.items() if n in self.catalog.services}, **served}
        self.keys = {name: MemoryKeys(virtual_now, atomic=service.atomic)
                     for name, service in served.items()}  # fmt: skip
        self.delivery_counts = MemoryCounter()  # delivery_counts: the request queues' limits
        self.sagas = {s.saga_id: s for s in plan.sagas}
        self.sabotaged: Counter[str] = Counter()
        self.coordinators = [CoordinatorProcess(self, i) for i in range(plan.coordinators)]
        self.adapters = [AdapterProcess(self, s, 0) for s in served.values()]
        if "email" in served:
            self.adapters += [AdapterProcess(self, served["email"], i)
                              for i in range(1, plan.email_processes)]  # fmt: skip
        self.processes: dict[str, CoordinatorProcess | AdapterProcess] = {
            c.name: c for c in self.coordinators
        }
        self.processes |= {a.name: a for a in self.adapters}
        self.quiet = False
        self.senders: dict[str, Sender] = {}
        self._background: dict[asyncio.Task[Any], None] = {}  # ordered: a set is by address
        self.armed: dict[str, tuple[str, float]] = {}  # process -> (crash point, down for)

    # --- time and notes ------------------------------------------------------------------------

    def now(self) -> datetime:
        return virtual_now()

    def note(self, who: str, what: str) -> None:
        self.records.timeline.append((asyncio.get_running_loop().time(), who, what))

    def background(self, work: Coroutine[Any, Any, Any]) -> None:
        """A command sent by someone who does not wait for its answer here."""
        task = asyncio.ensure_future(work)
        self._background[task] = None
        task.add_done_callback(lambda done: self._background.pop(done, None))

    def sender(self, user: str, *, person: str | None = None) -> Sender:
        name = f"{user}/{person}" if person else user
        if name not in self.senders:
            self.senders[name] = Sender(self, user, on_behalf_of=person)
        return self.senders[name]

    # --- what the processes report -----------------------------------------------------------

    def handled(self, process: str, message: PartitionMessage, note: str) -> None:
        t = asyncio.get_running_loop().time()
        self.records.handled.append((t, message.saga_id, message.type, message.message_id, note))

    def called(self, process: str, req: ActionRequest, attempt: int) -> None:
        self.records.calls[(req.idempotency_key, req.attempt)] += 1

    def sent_command(self, user: str, command: AnyCommand | QuerySaga) -> None:
        self.records.commands.setdefault(command.message_id, (user, command))
        self.records.sends[command.message_id] += 1

    def answered(self, reply: CommandReply) -> None:
        self.records.answers.setdefault(reply.command_id, []).append(reply)

    def bury(self, delivery: Any, death: Death, judged: Judgement) -> None:
        self.records.letters.append(Letter(
            delivery.body, dict(delivery.headers or {}), delivery.user_id, delivery.message_id,
            delivery.type, death.exchange or "", death.routing_key or "", judged.reason,
            judged.order_id, judged.blocks,
        ))  # fmt: skip
        self.note("dead-letters", f"{delivery.type} {delivery.message_id}: {judged.reason}")

    def sabotage(self, message: PartitionMessage) -> None:
        """The plan's injected bug: the coordinator's handler fails on a saga's start."""
        plan = self.sagas.get(message.saga_id)
        if plan is None or message.type != "saga.start" or self.quiet:
            return
        if self.sabotaged[message.saga_id] < plan.sabotage:
            self.sabotaged[message.saga_id] += 1
            raise RuntimeError(f"injected: the handler fails on the start of {message.saga_id}")

    async def crash_point(self, process: CoordinatorProcess | AdapterProcess, point: str) -> None:
        """Where the plan kills a process on purpose (a fault of kind "point", armed at its
        time, fires the next time the process passes the point): it dies there, as
        ``saga_shared.crashpoints`` kills a real one, and comes back later."""
        armed = self.armed.get(process.name)
        if armed is None or armed[0] != point or self.quiet:
            return
        del self.armed[process.name]
        process.stop(f"killed at {point}")
        self.background(scripts.restart(self, process, armed[1]))
        raise asyncio.CancelledError(f"killed at {point}")

    def first_coordinator(self) -> CoordinatorProcess | None:
        return next((c for c in self.coordinators if c.alive), None)

    # --- the run -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Every process up."""
        for c in self.coordinators:
            c.start()
        for a in self.adapters:
            await a.start()

    async def stop(self) -> None:
        for process in self.processes.values():
            process.stop("stopped")
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)

    async def run(self, *, settle_s: float = 900.0) -> None:
        await self.start()
        work = [asyncio.ensure_future(scripts.saga(self, s)) for s in self.plan.sagas]
        work += [asyncio.ensure_future(scripts.fault(self, f)) for f in self.plan.faults]
        work.append(asyncio.ensure_future(scripts.forgeries(self, self.plan.forgeries)))
        people = asyncio.ensure_future(scripts.people(self))
        await asyncio.sleep(self.plan.horizon_s + 60.0)
        await self.heal()
        await scripts.until_all_end(self, settle_s)
        for task in [*work, people]:
            task.cancel()
        await asyncio.gather(*work, people, return_exceptions=True)

    async def heal(self) -> None:
        """The quiet spell: every fault gone, every process up."""
        self.quiet = True
        self.note("world", "quiet: every fault healed")
        self.store.down_until = 0.0
        if not self.broker.up:
            self.broker.restart()
        self.systems.clear_faults()
        self.gateway.delay_s.clear()
        for process in self.processes.values():
            if isinstance(process, AdapterProcess):
                process.thaw()
            if not process.alive:
                await scripts.start(process)

    def saga(self, saga_id: str) -> SagaState | None:
        return self.store.memory.get(saga_id)
