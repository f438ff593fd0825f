"""An async client for agents: the same AMQP commands any agent in any language can publish.

    async with Bus(settings) as bus, SagaClient(bus) as client:
        saga_id = await client.start("refund", order_id="A-17", params={...})
        outcome = await client.wait(saga_id, seconds=30)

Each command carries ``reply_to`` (a private reply queue) and a message id (a fresh one unless the
caller gives it), so ``start``/``abort``/``resume``... return once the coordinator answered. A
command not answered is sent again (``saga_shared.transport.courier``), with the same message id and
the same body, every ``resend_every_s`` (growing by ``resend_backoff`` up to ``resend_max_s``) until
an answer comes or ``answer_within_s`` has passed; the coordinator answers a message id it has seen
with the reply it gave the first time, so a resend has one effect. What can happen, each its own
type:

- the answer: the call returns (``CommandRejected`` when it refused, with the reason);
- ``NotAnswered``: sent (the broker confirmed it holds it, or may have taken it) but no answer
  within the bound; it is applied when the coordinator runs, and sending it again with the same
  message id is safe;
- ``BrokerUnreachable``: nothing was sent (no connection, or the broker took no copy), so
  nothing will happen.

``wait`` follows the public lifecycle events.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import uuid
import warnings
from collections.abc import Mapping
from typing import Annotated, Any

from aio_pika.abc import AbstractChannel, AbstractIncomingMessage, AbstractQueue
from pydantic import Field, JsonValue, TypeAdapter

from saga_shared.errors import InvalidMessage
from saga_shared.model.answers import (
    BrokerUnreachable,
    CommandRejected,
    DeskRefused,
    MessageIdReused,
    NotAnswered,
    ResendSchedule,
    cause_of,
    reached,
    seconds_text,
)
from saga_shared.model.ids import random_id
from saga_shared.model.messages import (
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
    SettleSaga,
    StartSaga,
)
from saga_shared.transport.bus import Bus
from saga_shared.transport.codec import decode
from saga_shared.transport.courier import CONNECTION_TROUBLE, Courier

__all__ = [
    "BrokerUnreachable", "CommandRejected", "DeskRefused", "MessageIdReused", "NotAnswered",
    "ResendSchedule", "SagaClient",
]  # fmt: skip

ORDERS_KEPT = 10_000  # sagas whose order ``wait`` can look up without being told
TERMINAL_EVENTS = ("saga.completed", "saga.compensated", "saga.needs_human", "saga.resolved")
# Where a saga stops for someone: wait() returns at these too when asked to.
PAUSE_EVENTS = ("saga.awaiting_approval",)
_REPLY: TypeAdapter[CommandReply | DeskReply] = TypeAdapter(
    Annotated[CommandReply | DeskReply, Field(discriminator="type")]
)
_EVENT: TypeAdapter[SagaEvent] = TypeAdapter(SagaEvent)


class SagaClient:
    """``answer_within_s``: how long a command may take to be answered, unless a call says
    otherwise (the connection, when this client makes it, too). ``reply_timeout_s``: the same,
    deprecated."""

    def __init__(
        self,
        bus: Bus,
        *,
        answer_within_s: float = 30.0,
        resend_every_s: float = 2.0,
        resend_backoff: float = 1.5,
        resend_max_s: float = 10.0,
        reply_timeout_s: float | None = None,
    ) -> None:
        if reply_timeout_s is not None:
            warnings.warn(
                "SagaClient(reply_timeout_s=...) is deprecated: use answer_within_s",
                DeprecationWarning,
                stacklevel=2,
            )
            answer_within_s = reply_timeout_s
        self.bus = bus
        self.answer_within_s = answer_within_s
        self._courier = Courier(bus, ResendSchedule(resend_every_s, resend_backoff, resend_max_s))
        self._owns_bus = False  # open() connected the bus, so close() closes it
        self._channel: AbstractChannel | None = None
        self._reply_queue: AbstractQueue | None = None
        # Outcomes seen and not yet waited for, per saga, in arrival order.
        self._outcomes: dict[str, list[SagaEvent]] = {}
        # The order of each saga this client sent a command for (the latest ones), so that
        # ``wait`` can ask for a register.
        self._orders: dict[str, str] = {}
        self._waiters: dict[str, list[asyncio.Future[None]]] = {}
        # The reply to the last command: ``command.parked`` says it waits behind a blocked order.
        self.last_reply: CommandReply | None = None
        self._person: str | None = None

    @property
    def reply_timeout_s(self) -> float:
        """Deprecated: ``answer_within_s``."""
        return self.answer_within_s

    @reply_timeout_s.setter
    def reply_timeout_s(self, seconds: float) -> None:
        self.answer_within_s = seconds

    async def __aenter__(self) -> SagaClient:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def open(self) -> None:
        """Connect the bus if it is not (``BrokerUnreachable`` when that fails or takes longer
        than ``answer_within_s``), then open the reply queue and the events queue."""
        try:
            async with asyncio.timeout(self.answer_within_s):
                await self._open()
        except BaseException as exc:
            await self.close()
            if not isinstance(exc, CONNECTION_TROUBLE):
                raise
            within = self.answer_within_s
            cause = (
                f"no connection within {seconds_text(within)} s"
                if isinstance(exc, TimeoutError)
                else cause_of(exc)
            )
            raise BrokerUnreachable(url=self.bus.url, cause=cause, within_s=within) from None

    async def _open(self) -> None:
        if not self.bus.connected:
            self._owns_bus = True
            await self.bus.connect()
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
        view._owns_bus = False
        return view

    async def close(self) -> None:
        if self._channel is not None and not self._channel.is_closed:
            with contextlib.suppress(*CONNECTION_TROUBLE):
                await self._channel.close()
        self._channel = None
        if self._owns_bus:
            self._owns_bus = False
            with contextlib.suppress(*CONNECTION_TROUBLE):
                await self.bus.close()

    # Every command takes ``message_id`` (default: a fresh one): the same id again is the same
    # command, answered with the first one's reply; and ``answer_within_s`` (default: the
    # client's).

    async def start(
        self,
        saga: str | None = None,
        *,
        order_id: str,
        params: Mapping[str, JsonValue] | None = None,
        plan: Plan | None = None,
        saga_id: str | None = None,
        message_id: str | None = None,
        answer_within_s: float | None = None,
    ) -> str:
        command = StartSaga(
            message_id=message_id or random_id(),
            saga_id=saga_id or str(uuid.uuid4()),
            order_id=order_id,
            saga=saga,
            plan=plan,
            params=dict(params or {}),
            reply_to=self._reply_to(),
        )
        await self._send(command, answer_within_s)
        return command.saga_id

    # Decisions about a running saga. Who decided is not an argument: it is the broker user
    # this client connects as, which the broker verifies and the register records.

    async def abort(
        self, saga_id: str, *, order_id: str, reason: str, message_id: str | None = None,
        answer_within_s: float | None = None,
    ) -> None:  # fmt: skip
        """Stop forward progress; everything that may have landed is compensated."""
        await self._send(AbortSaga(message_id=message_id or random_id(), saga_id=saga_id,
                                   order_id=order_id, reason=reason, reply_to=self._reply_to()),
                         answer_within_s)  # fmt: skip

    async def resume(
        self, saga_id: str, *, order_id: str, note: str = "", message_id: str | None = None,
        answer_within_s: float | None = None,
    ) -> None:  # fmt: skip
        """Continue compensating a saga in ``needs_human`` (operators and people)."""
        await self._send(ResumeSaga(message_id=message_id or random_id(), saga_id=saga_id,
                                    order_id=order_id, note=note, reply_to=self._reply_to()),
                         answer_within_s)  # fmt: skip

    async def resolve(
        self, saga_id: str, *, order_id: str, note: str, message_id: str | None = None,
        answer_within_s: float | None = None,
    ) -> None:  # fmt: skip
        """A person takes over a saga in ``needs_human``; its order is released."""
        await self._send(ResolveSaga(message_id=message_id or random_id(), saga_id=saga_id,
                                     order_id=order_id, note=note, reply_to=self._reply_to()),
                         answer_within_s)  # fmt: skip

    async def approve(
        self, saga_id: str, *, order_id: str, note: str = "", step: int | None = None,
        message_id: str | None = None, answer_within_s: float | None = None,
    ) -> None:  # fmt: skip
        """Let a saga waiting at an approval gate go on (a person, or operations where the
        gate allows it; never an agent). ``step``: the gate's, as read from the register, so
        that an approval sent again never opens the saga's next gate."""
        await self._send(ApproveSaga(message_id=message_id or random_id(), saga_id=saga_id,
                                     order_id=order_id, note=note, step=step,
                                     reply_to=self._reply_to()), answer_within_s)  # fmt: skip

    async def reject(
        self, saga_id: str, *, order_id: str, reason: str, step: int | None = None,
        message_id: str | None = None, answer_within_s: float | None = None,
    ) -> None:  # fmt: skip
        """Refuse at the gate: the saga compensates what has landed."""
        await self._send(RejectSaga(message_id=message_id or random_id(), saga_id=saga_id,
                                    order_id=order_id, reason=reason, step=step,
                                    reply_to=self._reply_to()), answer_within_s)  # fmt: skip

    async def settle(
        self,
        saga_id: str,
        *,
        order_id: str,
        step: int,
        happened: bool,
        note: str,
        version: int | None = None,
        message_id: str | None = None,
        answer_within_s: float | None = None,
    ) -> CommandReply:
        """A person settles a step in doubt: it happened, or it did not (which takes effect
        once the step's service has fenced its key: the answer says which way it went).
        ``version``: the register's, as read, so an answer that came first wins."""
        return await self._send(SettleSaga(
            message_id=message_id or random_id(), saga_id=saga_id, order_id=order_id, step=step,
            happened=happened, note=note, version=version, reply_to=self._reply_to(),
        ), answer_within_s)  # fmt: skip

    # The operators' desk: dead letters.

    async def replay_dead_letters(
        self,
        *,
        dead_letter_id: int | None = None,
        order_id: str | None = None,
        death_reason: str | None = None,
        every: bool = False,
        note: str = "",
        message_id: str | None = None,
        answer_within_s: float | None = None,
    ) -> DeskReply:
        """Republish dead letters (one, an order's in its publish order, those that died for
        ``death_reason``, or all)."""
        command = ReplayDeadLetters(
            message_id=message_id or random_id(), dead_letter_id=dead_letter_id,
            order_id=order_id, death_reason=death_reason, all=every, note=note,
            reply_to=self._reply_to(),
        )  # fmt: skip
        return await self._send_desk(command, answer_within_s)

    async def discard_dead_letter(
        self, dead_letter_id: int, *, reason: str, message_id: str | None = None,
        answer_within_s: float | None = None,
    ) -> DeskReply:  # fmt: skip
        command = DiscardDeadLetter(
            message_id=message_id or random_id(), dead_letter_id=dead_letter_id, reason=reason,
            reply_to=self._reply_to(),
        )  # fmt: skip
        return await self._send_desk(command, answer_within_s)

    async def status(
        self, saga_id: str, *, order_id: str, message_id: str | None = None,
        answer_within_s: float | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        """The saga's register as it stands (``CommandRejected`` if there is no such saga)."""
        query = QuerySaga(message_id=message_id or random_id(), saga_id=saga_id,
                          order_id=order_id, reply_to=self._reply_to())  # fmt: skip
        reply = await self._send(query, answer_within_s)
        assert reply.saga_register is not None
        return reply.saga_register

    async def wait(
        self, saga_id: str, seconds: float, *, stops: bool = False, order_id: str | None = None
    ) -> SagaEvent:
        """The saga's next outcome: completed, compensated, needs_human or resolved; with
        ``stops``, also a stop at an approval gate (``saga.awaiting_approval``). An outcome
        it had reached already (a start sent again after the saga ended) is read from its
        register, asked for once: its event went out before this wait, maybe before this
        client. A stop at a gate is not: what is at stake there comes with its event only."""
        wanted = (*TERMINAL_EVENTS, *PAUSE_EVENTS) if stops else TERMINAL_EVENTS
        order_id = order_id or self._orders.get(saga_id)
        async with asyncio.timeout(seconds):
            while True:
                seen = self._outcomes.get(saga_id, [])
                while seen:
                    event = seen.pop(0)
                    if event.type in wanted:
                        return event
                if order_id is not None:
                    now = await self._reached(saga_id, order_id)
                    if now is not None:
                        return now
                    order_id = None  # once: from now on its events say
                    continue
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
    async def _reached(self, saga_id: str, order_id: str) -> SagaEvent | None:
        query = QuerySaga(saga_id=saga_id, order_id=order_id, reply_to=self._reply_to())
        try:
            reply = await self._courier.request(
                query, self.answer_within_s, person=self._person, traced=False
            )
        except (NotAnswered, BrokerUnreachable):
            return None  # no answer: its events will tell
        return reached(reply, TERMINAL_EVENTS)

    def _reply_to(self) -> str:
        if self._reply_queue is None:
            raise RuntimeError("SagaClient is not open")
        return self._reply_queue.name

    async def _request(
        self, command: Command, answer_within_s: float | None
    ) -> CommandReply | DeskReply:
        within = self.answer_within_s if answer_within_s is None else answer_within_s
        return await self._courier.request(command, within, person=self._person)

    async def _send(
        self, command: AnyCommand | QuerySaga, answer_within_s: float | None = None
    ) -> CommandReply:
        self._orders[command.saga_id] = command.order_id
        if len(self._orders) > ORDERS_KEPT:
            del self._orders[next(iter(self._orders))]
        reply = await self._request(command, answer_within_s)
        assert isinstance(reply, CommandReply)
        self.last_reply = reply
        if reply.type == "command.rejected":
            raise CommandRejected(reply)
        return reply

    async def _send_desk(
        self, command: ReplayDeadLetters | DiscardDeadLetter, answer_within_s: float | None = None
    ) -> DeskReply:
        reply = await self._request(command, answer_within_s)
        if isinstance(reply, CommandReply):  # refused by the gateway before the desk saw it
            raise CommandRejected(reply)
        if reply.type == "desk.refused":
            raise DeskRefused(reply.reason)
        return reply

    async def _on_reply(self, message: AbstractIncomingMessage) -> None:
        reply = self._decode(message, _REPLY)
        if reply is not None:
            self._courier.answered(reply)

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
