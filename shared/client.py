"""An async client for agents: the same AMQP commands any agent in any language can publish.

    async with Bus(settings) as bus, SagaClient(bus) as client:
        saga_id = await client.start("refund", order_id="A-17", params={...})
        outcome = await client.wait(saga_id, seconds=30)

Each command carries ``reply_to`` (a private reply queue), so ``start``/``abort``/``resume``
return once the coordinator has accepted the command and raise ``CommandRejected`` with the
gateway's reason otherwise. ``wait`` follows the public lifecycle events.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping
from typing import Any

from aio_pika.abc import AbstractChannel, AbstractIncomingMessage, AbstractQueue, ExchangeType
from pydantic import JsonValue, TypeAdapter

from shared.bus import Bus
from shared.codec import decode
from shared.errors import InvalidMessage, SagaError
from shared.messages import (
    AbortSaga,
    AnyCommand,
    CommandReply,
    Plan,
    ResolveSaga,
    ResumeSaga,
    SagaEvent,
    StartSaga,
)

TERMINAL_EVENTS = ("saga.completed", "saga.compensated", "saga.needs_human", "saga.resolved")
_REPLY: TypeAdapter[CommandReply] = TypeAdapter(CommandReply)
_EVENT: TypeAdapter[SagaEvent] = TypeAdapter(SagaEvent)


class CommandRejected(SagaError):
    def __init__(self, reply: CommandReply) -> None:
        super().__init__(reply.reason)
        self.reply = reply
        self.reason = reply.reason


class SagaClient:
    def __init__(self, bus: Bus, *, reply_timeout_s: float = 30.0) -> None:
        self.bus = bus
        self.reply_timeout_s = reply_timeout_s
        self._channel: AbstractChannel | None = None
        self._reply_queue: AbstractQueue | None = None
        self._pending: dict[str, asyncio.Future[CommandReply]] = {}
        self._outcomes: dict[str, SagaEvent] = {}
        self._waiters: dict[str, list[asyncio.Future[SagaEvent]]] = {}
        # The reply to the last command: ``command.parked`` says it waits behind a blocked order.
        self.last_reply: CommandReply | None = None

    async def __aenter__(self) -> SagaClient:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def open(self) -> None:
        channel = await self.bus.connection.channel()
        self._channel = channel
        self._reply_queue = await channel.declare_queue(exclusive=True, auto_delete=True)
        await self._reply_queue.consume(self._on_reply, no_ack=True)
        # Bound before any command is sent, so no outcome can slip past unseen.
        events = await channel.declare_queue(exclusive=True, auto_delete=True)
        exchange = await channel.declare_exchange(
            self.bus.topology.events_exchange, ExchangeType.TOPIC, durable=True
        )
        for key in TERMINAL_EVENTS:
            await events.bind(exchange, routing_key=key)
        await events.consume(self._on_event, no_ack=True)

    async def close(self) -> None:
        if self._channel is not None and not self._channel.is_closed:
            await self._channel.close()
        self._channel = None

    async def start(
        self,
        saga: str | None = None,
        *,
        order_id: str,
        params: Mapping[str, JsonValue] | None = None,
        plan: Plan | None = None,
        saga_id: str | None = None,
    ) -> str:
        command = StartSaga(
            saga_id=saga_id or str(uuid.uuid4()),
            order_id=order_id,
            saga=saga,
            plan=plan,
            params=dict(params or {}),
            reply_to=self._reply_to(),
        )
        await self._send(command)
        return command.saga_id

    async def abort(self, saga_id: str, *, order_id: str, reason: str) -> None:
        cmd = AbortSaga(
            saga_id=saga_id, order_id=order_id, reason=reason, reply_to=self._reply_to()
        )
        await self._send(cmd)

    async def resume(self, saga_id: str, *, order_id: str, note: str = "", by: str = "") -> None:
        cmd = ResumeSaga(
            saga_id=saga_id, order_id=order_id, note=note, by=by, reply_to=self._reply_to()
        )
        await self._send(cmd)

    async def resolve(self, saga_id: str, *, order_id: str, note: str, by: str = "") -> None:
        """A person takes over a saga in ``needs_human``; its order is released."""
        cmd = ResolveSaga(
            saga_id=saga_id, order_id=order_id, note=note, by=by, reply_to=self._reply_to()
        )
        await self._send(cmd)

    async def wait(self, saga_id: str, seconds: float) -> SagaEvent:
        """The next terminal event (completed, compensated or needs_human) of this saga."""
        if saga_id in self._outcomes:
            return self._outcomes.pop(saga_id)
        future: asyncio.Future[SagaEvent] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(saga_id, []).append(future)
        try:
            return await asyncio.wait_for(future, seconds)
        finally:
            waiters = self._waiters.get(saga_id, [])
            if future in waiters:
                waiters.remove(future)

    def forget(self, saga_id: str) -> None:
        """Drop an outcome seen before (call before ``resume`` when waiting for the next one)."""
        self._outcomes.pop(saga_id, None)

    # --- internals ------------------------------------------------------------------------------
    def _reply_to(self) -> str:
        if self._reply_queue is None:
            raise RuntimeError("SagaClient is not open")
        return self._reply_queue.name

    async def _send(self, command: AnyCommand) -> CommandReply:
        future: asyncio.Future[CommandReply] = asyncio.get_running_loop().create_future()
        self._pending[command.message_id] = future
        try:
            await self.bus.publish(self.bus.topology.commands_exchange, command.type, command)
            reply = await asyncio.wait_for(future, self.reply_timeout_s)
        finally:
            self._pending.pop(command.message_id, None)
        self.last_reply = reply
        if reply.type == "command.rejected":
            raise CommandRejected(reply)
        return reply

    async def _on_reply(self, message: AbstractIncomingMessage) -> None:
        reply = self._decode(message, _REPLY)
        if reply is None:
            return
        future = self._pending.get(reply.command_id)
        if future is not None and not future.done():
            future.set_result(reply)

    async def _on_event(self, message: AbstractIncomingMessage) -> None:
        event = self._decode(message, _EVENT)
        if event is None:
            return
        waiters = self._waiters.pop(event.saga_id, [])
        live = [w for w in waiters if not w.done()]
        for waiter in live:
            waiter.set_result(event)
        if not live:
            self._outcomes[event.saga_id] = event

    def _decode(self, message: AbstractIncomingMessage, adapter: TypeAdapter[Any]) -> Any:
        try:
            return decode(message.body, adapter, max_bytes=self.bus.settings.max_message_bytes)
        except InvalidMessage:
            return None
