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
import copy
import uuid
from collections.abc import Mapping
from typing import Annotated, Any

from aio_pika.abc import AbstractChannel, AbstractIncomingMessage, AbstractQueue
from pydantic import Field, JsonValue, TypeAdapter

from shared import tracing
from shared.bus import Bus
from shared.codec import decode
from shared.errors import InvalidMessage, SagaError
from shared.messages import (
    AbortSaga,
    AnyCommand,
    ApproveSaga,
    Command,
    CommandReply,
    DeskReply,
    DiscardDeadLetter,
    Plan,
    QuerySaga,
    RejectSaga,
    ReplayDeadLetters,
    ResolveSaga,
    ResumeSaga,
    SagaEvent,
    StartSaga,
)
from shared.trust import ON_BEHALF_HEADER

TERMINAL_EVENTS = ("saga.completed", "saga.compensated", "saga.needs_human", "saga.resolved")
# Where a saga stops for someone: wait() returns at these too when asked to.
PAUSE_EVENTS = ("saga.awaiting_approval",)
_REPLY: TypeAdapter[CommandReply | DeskReply] = TypeAdapter(
    Annotated[CommandReply | DeskReply, Field(discriminator="type")]
)
_EVENT: TypeAdapter[SagaEvent] = TypeAdapter(SagaEvent)


class DeskRefused(SagaError):
    """The desk could not do what was asked (no such dead letter)."""


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
        self._pending: dict[str, asyncio.Future[CommandReply | DeskReply]] = {}
        # Outcomes seen and not yet waited for, per saga, in arrival order.
        self._outcomes: dict[str, list[SagaEvent]] = {}
        self._waiters: dict[str, list[asyncio.Future[None]]] = {}
        # The reply to the last command: ``command.parked`` says it waits behind a blocked order.
        self.last_reply: CommandReply | None = None
        self._person: str | None = None

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
        # Passive: an agent may not declare exchanges, only check that this one exists.
        exchange = await channel.get_exchange(self.bus.topology.events_exchange, ensure=True)
        for key in (*TERMINAL_EVENTS, *PAUSE_EVENTS):
            await events.bind(exchange, routing_key=key)
        await events.consume(self._on_event, no_ack=True)

    def on_behalf_of(self, person: str) -> SagaClient:
        """This client, sending for ``person`` (the console's signed-in people): it shares the
        open channel and reply queue, and its commands name the person, which the coordinator
        honours only from the console's account."""
        view = copy.copy(self)
        view._person = person
        return view

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

    # Decisions about a running saga. Who decided is not an argument: it is the broker user
    # this client connects as, which the broker verifies and the register records.

    async def abort(self, saga_id: str, *, order_id: str, reason: str) -> None:
        """Stop forward progress; everything that may have landed is compensated."""
        await self._send(AbortSaga(saga_id=saga_id, order_id=order_id, reason=reason,
                                   reply_to=self._reply_to()))  # fmt: skip

    async def resume(self, saga_id: str, *, order_id: str, note: str = "") -> None:
        """Continue compensating a saga in ``needs_human`` (operators and people)."""
        await self._send(ResumeSaga(saga_id=saga_id, order_id=order_id, note=note,
                                    reply_to=self._reply_to()))  # fmt: skip

    async def resolve(self, saga_id: str, *, order_id: str, note: str) -> None:
        """A person takes over a saga in ``needs_human``; its order is released."""
        await self._send(ResolveSaga(saga_id=saga_id, order_id=order_id, note=note,
                                     reply_to=self._reply_to()))  # fmt: skip

    async def approve(self, saga_id: str, *, order_id: str, note: str = "") -> None:
        """Let a saga waiting at an approval gate go on (a person, or operations where the
        gate allows it; never an agent)."""
        await self._send(ApproveSaga(saga_id=saga_id, order_id=order_id, note=note,
                                     reply_to=self._reply_to()))  # fmt: skip

    async def reject(self, saga_id: str, *, order_id: str, reason: str) -> None:
        """Refuse at the gate: the saga compensates what has landed."""
        await self._send(RejectSaga(saga_id=saga_id, order_id=order_id, reason=reason,
                                    reply_to=self._reply_to()))  # fmt: skip

    # The operators' desk: dead letters.

    async def replay_dead_letters(
        self,
        *,
        dead_letter_id: int | None = None,
        order_id: str | None = None,
        death_reason: str | None = None,
        every: bool = False,
        note: str = "",
    ) -> DeskReply:
        """Republish dead letters (one, an order's in its publish order, those that died for
        ``death_reason``, or all)."""
        command = ReplayDeadLetters(
            dead_letter_id=dead_letter_id, order_id=order_id, death_reason=death_reason,
            all=every, note=note, reply_to=self._reply_to(),
        )  # fmt: skip
        return await self._send_desk(command)

    async def discard_dead_letter(self, dead_letter_id: int, *, reason: str) -> DeskReply:
        command = DiscardDeadLetter(
            dead_letter_id=dead_letter_id, reason=reason, reply_to=self._reply_to()
        )
        return await self._send_desk(command)

    async def status(self, saga_id: str, *, order_id: str) -> dict[str, Any]:
        """The saga's register as it stands (``CommandRejected`` if there is no such saga)."""
        reply = await self._send(
            QuerySaga(saga_id=saga_id, order_id=order_id, reply_to=self._reply_to())
        )
        assert reply.saga_register is not None
        return reply.saga_register

    async def wait(self, saga_id: str, seconds: float, *, stops: bool = False) -> SagaEvent:
        """The saga's next outcome: completed, compensated, needs_human or resolved; with
        ``stops``, also a stop at an approval gate (``saga.awaiting_approval``)."""
        wanted = (*TERMINAL_EVENTS, *PAUSE_EVENTS) if stops else TERMINAL_EVENTS
        async with asyncio.timeout(seconds):
            while True:
                seen = self._outcomes.get(saga_id, [])
                while seen:
                    event = seen.pop(0)
                    if event.type in wanted:
                        return event
                arrived: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                self._waiters.setdefault(saga_id, []).append(arrived)
                try:
                    await arrived
                finally:
                    waiters = self._waiters.get(saga_id, [])
                    if arrived in waiters:
                        waiters.remove(arrived)

    def forget(self, saga_id: str) -> None:
        """Drop the outcomes seen so far (call before a decision when waiting for the next)."""
        self._outcomes.pop(saga_id, None)

    # --- internals ------------------------------------------------------------------------------
    def _reply_to(self) -> str:
        if self._reply_queue is None:
            raise RuntimeError("SagaClient is not open")
        return self._reply_queue.name

    async def _send(self, command: AnyCommand | QuerySaga) -> CommandReply:
        reply = await self._request(command)
        assert isinstance(reply, CommandReply)
        self.last_reply = reply
        if reply.type == "command.rejected":
            raise CommandRejected(reply)
        return reply

    async def _send_desk(self, command: ReplayDeadLetters | DiscardDeadLetter) -> DeskReply:
        reply = await self._request(command)
        if isinstance(reply, CommandReply):  # refused by the gateway before the desk saw it
            raise CommandRejected(reply)
        if reply.type == "desk.refused":
            raise DeskRefused(reply.reason)
        return reply

    async def _request(self, command: Command) -> CommandReply | DeskReply:
        future: asyncio.Future[CommandReply | DeskReply] = (
            asyncio.get_running_loop().create_future()
        )
        self._pending[command.message_id] = future
        try:
            # A command of an order goes straight to its partition; a desk command to the intake.
            order_id = getattr(command, "order_id", None)
            key = (
                self.bus.topology.command_key(command.type, order_id) if order_id else command.type
            )
            saga_id = getattr(command, "saga_id", "")
            with tracing.current(
                f"send {command.type}", kind=tracing.SpanKind.PRODUCER,
                attributes=lambda: tracing.attributes(saga_id, order_id or ""),
            ):  # fmt: skip
                headers = tracing.headers_of()
                if self._person is not None:
                    headers[ON_BEHALF_HEADER] = self._person
                await self.bus.publish(self.bus.topology.commands_exchange, key, command, headers)
            return await asyncio.wait_for(future, self.reply_timeout_s)
        finally:
            self._pending.pop(command.message_id, None)

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
        self._outcomes.setdefault(event.saga_id, []).append(event)
        for waiter in self._waiters.pop(event.saga_id, []):
            if not waiter.done():
                waiter.set_result(None)

    def _decode(self, message: AbstractIncomingMessage, adapter: TypeAdapter[Any]) -> Any:
        try:
            return decode(message.body, adapter, max_bytes=self.bus.settings.max_message_bytes)
        except InvalidMessage:
            return None
