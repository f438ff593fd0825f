"""Test your catalog and your services' functions without RabbitMQ or Postgres.

    async with SagaKit("my-catalog.toml", [warehouse.SERVICE]) as kit:
        kit.fail("warehouse.pick", "permanent")
        saga_id = await kit.start("pick_and_ship", order_id="o-1", params={...})
        assert kit.status(saga_id) == "compensated"
        await kit.advance(60)  # a fake clock: step deadlines and gate time-outs fire

The kit runs the coordinator's own processor (convoy, state machine, deadlines, hand-over) over the
in-memory store (``saga_coordinator.memory``), and the adapter framework (``saga_services.adapter``:
parameter checks, retries, outcomes) around your functions, called in-process; messages travel
through the in-memory bus (``saga_shared.transport.memory_bus``), both twins held to the real ones'
contracts. They are delivered in publish order, one at a time, until nothing is left; retries do not
wait. What it does not have is a broker's failures: no redeliveries, dead letters or consumer
restarts (the integration tests cover those)."""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import TracebackType
from typing import Annotated, Any, Literal

from pydantic import Field, JsonValue, TypeAdapter

from saga_coordinator.authority import may_send
from saga_coordinator.gatekeeper import stamped
from saga_coordinator.memory import MemoryStore
from saga_coordinator.processor import Processor
from saga_coordinator.register import SagaState
from saga_services.adapter import Adapter
from saga_services.errors import Permanent, Transient
from saga_services.keys import MemoryKeys
from saga_services.sdk import Result, Service
from saga_shared.client import CommandRejected
from saga_shared.config import Settings
from saga_shared.errors import PlanRejected
from saga_shared.model.catalog import Catalog, service_of
from saga_shared.model.gateway import admit, load_catalog
from saga_shared.model.messages import (
    AbortSaga,
    ActionRequest,
    AnyCommand,
    ApproveSaga,
    CommandReply,
    Plan,
    RejectSaga,
    ResolveSaga,
    ResumeSaga,
    Role,
    SagaEvent,
    Sender,
    SettleRequest,
    StartSaga,
)
from saga_shared.transport.codec import PARTITION
from saga_shared.transport.memory_bus import MemoryBus
from saga_shared.transport.topology import Topology

FaultMode = Literal["permanent", "transient", "hang"]
REPLIES, EVENTS = "kit.replies", "kit.events"  # the kit's own queues, as a client's
_EVENT: TypeAdapter[SagaEvent] = TypeAdapter(SagaEvent)
_ACTION: TypeAdapter[ActionRequest | SettleRequest] = TypeAdapter(
    Annotated[ActionRequest | SettleRequest, Field(discriminator="type")]
)


class _Hang(Exception):
    """The call never answers: the request is dropped, its deadline will fire."""


class _Fault:
    def __init__(self, mode: FaultMode, times: int | None) -> None:
        self.mode, self.left = mode, times


class _Faulty(Service[Any]):
    """A service whose calls first pass the kit's injected faults."""

    def __init__(self, inner: Service[Any], kit: SagaKit) -> None:
        super().__init__(inner.name, status=inner.status, atomic=inner.atomic)
        self._inner, self._kit = inner, kit
        self._handlers = inner._handlers
        self._setup = inner._setup

    async def call(self, req: ActionRequest, deps: Any, *, attempt: int = 1) -> Result:
        self._kit.calls.append(req)
        fault = self._kit.fault_for(req)
        if fault == "permanent":
            raise Permanent(f"injected permanent fault on {req.action}")
        if fault == "transient":
            raise Transient(f"injected transient fault on {req.action}")
        if fault == "hang":
            raise _Hang(req.action)
        return await self._inner.call(req, deps, attempt=attempt)


class SagaKit:
    def __init__(
        self,
        catalog: Catalog | Path | str,
        services: Sequence[Service[Any]] = (),
        *,
        now: datetime | None = None,
        settings: Settings | None = None,
    ) -> None:
        self.catalog = catalog if isinstance(catalog, Catalog) else load_catalog(Path(catalog))
        self.settings = settings or Settings(identity="shared", partitions=1)
        self.topology = dataclasses.replace(
            Topology.from_settings(self.settings), declared_services=self.catalog.services
        )
        self.processor = Processor(self.catalog, self.topology)
        self.store = MemoryStore()
        self.now = now or datetime(2026, 1, 1, tzinfo=UTC)
        self.sent: list[Any] = []  # every message, in the order it went out
        self.calls: list[ActionRequest] = []  # every call of a function, retries included
        # requests (and settles) no service took, or that hung
        self.unanswered: list[ActionRequest | SettleRequest] = []
        self._faults: dict[tuple[str, str | None], _Fault] = {}
        self.bus = MemoryBus(self.topology)
        self.bus.bind(EVENTS, self.topology.events_exchange, "#")
        self.bus.bind(REPLIES, "", REPLIES)
        self._consumed = {q for q in self.topology.all_queues() if q != self.topology.intake_queue}
        self._consumed |= {EVENTS, REPLIES}
        self._replies: dict[str, CommandReply] = {}
        self._adapters: dict[str, Adapter] = {}
        self._resources = contextlib.AsyncExitStack()
        for service in services:
            # The key record in memory, read against the kit's clock: a claim's lease runs out
            # as the kit's time moves on.
            keys = MemoryKeys(lambda: self.now, atomic=service.atomic)
            adapter = Adapter(
                _Faulty(service, self), self.settings, self.catalog, None, None,
                sleep=_no_wait, keys=keys, owner=f"{service.name}@kit",
            )  # fmt: skip
            self._adapters[service.name] = adapter

    async def __aenter__(self) -> SagaKit:
        for adapter in self._adapters.values():
            await adapter.open()
            self._resources.push_async_callback(adapter.aclose)
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._resources.aclose()

    # --- what a test does -----------------------------------------------------------------------

    def fail(
        self, action: str, mode: FaultMode, *, order_id: str | None = None, times: int | None = None
    ) -> None:
        """Calls of ``action`` (of one order, or of all) fail: ``permanent`` (the system says
        no), ``transient`` (``times`` calls, then it works; None: every call), or ``hang`` (no
        answer at all, until the step's deadline fires on ``advance``)."""
        if action not in self.catalog.actions and action not in self.catalog.compensations:
            raise ValueError(f"unknown action {action!r}")
        self._faults[(action, order_id)] = _Fault(mode, times)

    def clear_faults(self) -> None:
        self._faults.clear()

    def deps(self, service: str) -> Any:
        """What the service's setup yielded (your fake system, to assert its effects)."""
        return self._adapters[service]._deps

    async def start(
        self,
        saga: str | None = None,
        *,
        order_id: str,
        params: dict[str, JsonValue] | None = None,
        plan: Plan | None = None,
        saga_id: str | None = None,
    ) -> str:
        """Start a named saga (or an ad-hoc ``plan``) as an agent, and run until nothing moves.
        Raises ``PlanRejected`` or ``CommandRejected`` as the gateway or the coordinator would."""
        command = StartSaga(
            saga_id=saga_id or str(uuid.uuid4()), order_id=order_id, saga=saga, plan=plan,
            params=params or {},
        )  # fmt: skip
        admit(self.catalog, command)
        await self._command(command, "agent")
        return command.saga_id

    async def approve(
        self, saga_id: str, *, note: str = "", by: str = "ana", role: Role = "person"
    ) -> None:
        await self._command(ApproveSaga(**self._ids(saga_id), note=note), role, by)

    async def reject(
        self, saga_id: str, *, reason: str, by: str = "ana", role: Role = "person"
    ) -> None:
        await self._command(RejectSaga(**self._ids(saga_id), reason=reason), role, by)

    async def abort(self, saga_id: str, *, reason: str, by: str = "agent") -> None:
        await self._command(AbortSaga(**self._ids(saga_id), reason=reason), "agent", by)

    async def resume(self, saga_id: str, *, note: str = "", by: str = "ops") -> None:
        await self._command(ResumeSaga(**self._ids(saga_id), note=note), "ops", by)

    async def resolve(self, saga_id: str, *, note: str, by: str = "ana") -> None:
        await self._command(ResolveSaga(**self._ids(saga_id), note=note), "person", by)

    async def advance(self, seconds: float) -> None:
        """Move the clock on; fire the step deadlines and gate time-outs now due."""
        self.now += timedelta(seconds=seconds)
        for message in self.store.due(self.now):
            await self._process(message)
        await self._settle()

    # --- what a test looks at -------------------------------------------------------------------

    def register(self, saga_id: str) -> SagaState:
        state = self.store.get(saga_id)
        if state is None:
            raise KeyError(f"no saga {saga_id!r}")
        return state

    def status(self, saga_id: str) -> str:
        return self.register(saga_id).status

    def events(self, saga_id: str | None = None) -> list[str]:
        """The lifecycle events published (``SAGA_EVENTS`` chooses which), by type."""
        return [
            m.type for m in self.sent if isinstance(m, SagaEvent) and saga_id in (None, m.saga_id)
        ]

    def requests(self, saga_id: str | None = None) -> list[ActionRequest]:
        """The action requests the coordinator sent (re-sends included)."""
        sent = [m for m in self.sent if isinstance(m, ActionRequest)]
        return [m for m in sent if saga_id in (None, m.saga_id)]

    # --- the machinery --------------------------------------------------------------------------

    def fault_for(self, req: ActionRequest) -> FaultMode | None:
        fault = self._faults.get((req.action, req.order_id)) or self._faults.get((req.action, None))
        if fault is None or fault.left == 0:
            return None
        if fault.left is not None:
            fault.left -= 1
        return fault.mode

    def _ids(self, saga_id: str) -> dict[str, Any]:
        return {"saga_id": saga_id, "order_id": self.register(saga_id).order_id}

    async def _command(self, command: AnyCommand, role: Role, user: str = "agent") -> None:
        refused = may_send(role, command.type)
        if refused is not None:
            raise PlanRejected("not_permitted", refused)
        sender = Sender(user=user, role=role)
        sent = command.model_copy(update={"reply_to": REPLIES, "sender": sender})
        await self._process(stamped(sent))
        await self._settle()
        reply = self._replies.get(command.message_id)
        if reply is not None and reply.type == "command.rejected":
            raise CommandRejected(reply)

    async def _process(self, message: Any) -> None:
        """One partition message in one transaction; then what it committed is published."""
        now = self.now
        await self.store.run(lambda tx: self.processor.handle(tx, message, now))
        for row in self.store.take_outbox():
            self.bus.publish_body(row.exchange, row.routing_key, row.message_type, row.body)

    async def _settle(self) -> None:
        """Deliver what was published, in publish order, until nothing is left."""
        while (taken := self.bus.next(self._consumed)) is not None:
            await self._deliver(*taken)

    async def _deliver(self, queue: str, body: bytes) -> None:
        kind, _ = self.topology.kind_of(queue)
        if kind == "partition":
            message = PARTITION.validate_json(body)
            self.sent.append(message)
            await self._process(message)
        elif kind == "action":
            req = _ACTION.validate_json(body)
            self.sent.append(req)
            await (self._answer_settle(req) if isinstance(req, SettleRequest)
                   else self._perform(req))  # fmt: skip
        elif queue == EVENTS:
            self.sent.append(_EVENT.validate_json(body))
        elif queue == REPLIES:
            reply = CommandReply.model_validate_json(body)
            self.sent.append(reply)
            self._replies[reply.command_id] = reply

    async def _answer_settle(self, req: SettleRequest) -> None:
        """A settle, answered from the service's key record as its adapter would."""
        adapter = self._adapters.get(service_of(req.action))
        if adapter is None:
            self.unanswered.append(req)
            return
        answer = await adapter.settle(req)
        key = self.topology.partition_key(req.order_id)
        await self.bus.publish(self.topology.partitions_exchange, key, answer)

    async def _perform(self, req: ActionRequest) -> None:
        adapter = self._adapters.get(service_of(req.action))
        if adapter is None:
            self.unanswered.append(req)  # no adapter runs: its deadline will fire
            return
        try:
            outcome = await adapter.perform(req)
        except _Hang:
            self.unanswered.append(req)
            return
        if outcome is None:  # another process holds its claim (never in a test kit's run)
            self.unanswered.append(req)
            return
        key = self.topology.partition_key(req.order_id)
        await self.bus.publish(self.topology.partitions_exchange, key, outcome)


async def _no_wait(seconds: float) -> None:
    return None
