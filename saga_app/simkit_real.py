"""The test harness of ``saga_app.simkit`` on the real stack: RabbitMQ and Postgres from the
environment (``SAGA_AMQP_URL``, ``SAGA_DATABASE_URL``, ``SAGA_IDENTITY=shared`` on a development
broker), the stack in this process with one's services in it, in a namespace of its own that is
removed afterwards. The same test, the same assertions; real time."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aio_pika

from saga_app.simkit import FaultMode, Statuses, _Faults, _gate, _until, _where, served
from saga_app.stack import Stack
from saga_coordinator.register import SagaState
from saga_services.sdk import Service
from saga_shared.client import SagaClient
from saga_shared.config import Settings
from saga_shared.model.gateway import load_catalog
from saga_shared.model.ids import random_id
from saga_shared.model.messages import CommandReply, SagaEvent
from saga_shared.storage.migrations import migrate
from saga_shared.transport.bus import Bus


class RealStack:
    def __init__(self, catalog: Path, services: Sequence[Service[Any]]) -> None:
        self.settings = Settings.from_env().with_(catalog_path=str(catalog),
                                         namespace=f"kit-{random_id()[:8]}")  # fmt: skip
        self.catalog = load_catalog(catalog)
        self.faults = _Faults()
        self.stack = Stack(self.settings, ["all"],
                           services=served(self.catalog, services, self.faults))  # fmt: skip
        self.events: list[SagaEvent] = []

    async def __aenter__(self) -> RealStack:
        await migrate(self.settings.database_url)
        await self.stack.start()
        self.bus = await Bus(self.settings).__aenter__()
        self.client = await SagaClient(self.bus, answer_within_s=60).__aenter__()
        channel = await self.bus.connection.channel()
        queue = await channel.declare_queue(exclusive=True, auto_delete=True)
        await queue.bind(self.settings.namespace + ".events", routing_key="#")
        await queue.consume(self._heard, no_ack=True)
        return self

    async def _heard(self, message: aio_pika.abc.AbstractIncomingMessage) -> None:
        self.events.append(SagaEvent.model_validate_json(message.body))

    async def __aexit__(self, *exc: object) -> None:
        await self.client.close()
        await self.stack.stop()
        channel = await self.bus.connection.channel()
        await self.bus.topology.delete(channel)
        await self.bus.__aexit__(None, None, None)

    def fail(self, action: str, mode: FaultMode, *, order_id: str | None = None,
             times: int | None = None) -> None:  # fmt: skip
        self.faults.add(self.catalog, action, mode, order_id, times)

    async def start(self, saga: str, *, order_id: str, params: dict[str, Any],
                    saga_id: str | None = None) -> str:  # fmt: skip
        return await self.client.start(saga, order_id=order_id, params=params, saga_id=saga_id)

    async def _last(self) -> CommandReply:
        assert self.client.last_reply is not None
        return self.client.last_reply

    async def abort(self, saga_id: str, *, reason: str) -> CommandReply:
        state = await self.register(saga_id)
        await self.client.abort(saga_id, order_id=state.order_id, reason=reason)
        return await self._last()

    async def approve(self, saga_id: str, *, note: str = "") -> CommandReply:
        state = await self.register(saga_id)
        await self.client.approve(saga_id, order_id=state.order_id, note=note, step=_gate(state))
        return await self._last()

    async def reject(self, saga_id: str, *, reason: str) -> CommandReply:
        state = await self.register(saga_id)
        await self.client.reject(saga_id, order_id=state.order_id, reason=reason,
                                 step=_gate(state))  # fmt: skip
        return await self._last()

    async def resume(self, saga_id: str, *, note: str = "") -> CommandReply:
        state = await self.register(saga_id)
        await self.client.resume(saga_id, order_id=state.order_id, note=note)
        return await self._last()

    async def settle(self, saga_id: str, *, happened: bool, note: str) -> CommandReply:
        state = await self.register(saga_id)
        step = next(s.index for s in state.steps if s.status == "in_doubt")
        return await self.client.settle(
            saga_id, order_id=state.order_id, step=step, happened=happened, note=note,
            version=state.version,
        )  # fmt: skip

    async def register(self, saga_id: str) -> SagaState:
        state = await self.stack.store.get(saga_id)
        if state is None:
            raise KeyError(f"no saga {saga_id!r}")
        return state

    async def reaches(self, saga_id: str, status: Statuses, *, within: float = 60.0) -> SagaState:
        wanted = {status} if isinstance(status, str) else set(status)
        last: list[SagaState | None] = [None]

        def found() -> SagaState | None:
            return last[0] if last[0] is not None and last[0].status in wanted else None

        async def poll() -> None:
            while True:
                last[0] = await self.stack.store.get(saga_id)
                await asyncio.sleep(0.1)

        polling = asyncio.ensure_future(poll())
        try:
            return await _until(found, within, f"saga {saga_id} never reached {sorted(wanted)}",
                                lambda: _where(last[0]))  # fmt: skip
        finally:
            polling.cancel()

    async def published(self, event: str, saga_id: str | None = None, *,
                        within: float = 60.0) -> SagaEvent:  # fmt: skip
        def found() -> SagaEvent | None:
            return next((e for e in self.events if e.type == event
                         and saga_id in (None, e.saga_id)), None)  # fmt: skip

        what = f"no {event} published for {saga_id or 'any saga'}"
        return await _until(found, within, what, lambda: str([e.type for e in self.events][-10:]))

    def deps(self, service: str) -> Any:
        raise NotImplementedError("the real stack's adapters keep their own dependencies")
