"""A simulated process's side of the broker: its ``Connection`` (publishing with confirms) and
each ``Consumer`` it subscribes (one channel each, as ``saga_shared.transport.consumer`` opens
them)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import pamqp.commands

from saga_app.sim.errors import (
    BrokerDown,
    ChannelGone,
    NotFound,
    UnknownDeliveryTag,
    UserIdMismatch,
)
from saga_app.sim.messages import FakeDelivery, Props, Stored, Verb
from saga_app.sim.queues import SimQueue

if TYPE_CHECKING:
    from saga_app.sim.broker import Broker

Callback = Callable[[FakeDelivery], Awaitable[object]]
Closed = Callable[[str], object]  # told why, once, when a connection or consumer closes


class Publishable(Protocol):
    """``saga_shared.transport.codec.Outgoing`` or ``aio_pika.Message``."""

    @property
    def body(self) -> bytes: ...

    @property
    def properties(self) -> pamqp.commands.Basic.Properties: ...


@dataclass(frozen=True, slots=True)
class Publish:
    """One publish on its way to the broker."""

    mid: int
    exchange: str
    routing_key: str
    body: bytes
    props: Props
    headers: dict[str, Any]
    mandatory: bool


class Connection:
    """One process's connection. Closing it (a graceful stop or a crash: the broker sees the
    same) cancels its consumers, giving back what they held, fails the confirms it awaits,
    and deletes its exclusive queues. Publishes already sent still reach the broker."""

    def __init__(self, broker: Broker, number: int, user: str | None, name: str) -> None:
        self.broker = broker
        self.number = number
        self.user = user
        self.name = name or f"connection {number}"
        self.closed = False
        self.consumers: list[Consumer] = []
        self._pending: dict[int, tuple[asyncio.Future[None], str | None]] = {}  # by mid
        self._last_sent = self._last_confirm = 0.0  # one TCP stream: in order both ways
        self._tags = itertools.count(1)
        self._on_close: list[Closed] = []

    def __repr__(self) -> str:
        return f"Connection({self.name}{', closed' if self.closed else ''})"

    def add_close_callback(self, callback: Closed) -> None:
        self._on_close.append(callback)

    def send(
        self, exchange: str, routing_key: str, message: Publishable, *, mandatory: bool = False
    ) -> asyncio.Future[None]:
        """Publish; the future is the confirm: None, ``Unroutable`` (mandatory, no queue
        took it), or ``BrokerDown`` (the connection closed before the confirm came). Raises
        at once when the broker is down or the connection closed (nothing was sent)."""
        b = self.broker
        if self.closed or not b.up:
            raise BrokerDown(f"{self.name}: {'closed' if self.closed else 'the broker is down'}")
        if not b.router.knows(exchange):
            raise NotFound(f"no exchange '{exchange}'")
        props = Props.of(message.properties)
        if props.user_id is not None and props.user_id != self.user:
            raise UserIdMismatch(f"user_id '{props.user_id}' is not the connection's user")
        headers = dict(message.properties.headers or {})
        mid = b.next_mid()
        publish = Publish(mid, exchange, routing_key, message.body, props, headers, mandatory)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending[mid] = future, props.message_id
        b.sent(publish)
        self._last_sent = b.schedule(self._last_sent, b.arrive, self, publish)
        return future

    async def publish(
        self, exchange: str, routing_key: str, message: Publishable, *, mandatory: bool = False
    ) -> None:
        """``send`` and wait for its confirm."""
        await self.send(exchange, routing_key, message, mandatory=mandatory)

    def confirm(self, mid: int, error: Exception | None) -> None:
        """The broker took publish ``mid`` (``error``: it returned it): tell the publisher."""
        if not self.closed:
            self._last_confirm = self.broker.schedule(
                self._last_confirm, self._confirmed, mid, error
            )

    def _confirmed(self, mid: int, error: Exception | None) -> None:
        future, message_id = self._pending.pop(mid, (None, None))
        if future is None or future.done():
            return  # the connection closed meanwhile, or the publisher stopped waiting
        detail = "returned" if error else ""
        self.broker.record("confirm", mid=mid, message_id=message_id, detail=detail)
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)

    def consume(self, queue: str, callback: Callback, *, prefetch: int = 0) -> Consumer:
        """Subscribe ``callback`` (run in a task of its own per delivery, as aio-pika does)
        with at most ``prefetch`` deliveries unsettled (0: no limit)."""
        b = self.broker
        if self.closed or not b.up:
            raise BrokerDown(f"{self.name}: {'closed' if self.closed else 'the broker is down'}")
        found = b.queues.get(queue)
        if found is None:
            raise NotFound(f"no queue '{queue}'")
        tag = f"ctag{self.number}.{next(self._tags)}"
        consumer = Consumer(self, found, callback, prefetch, tag)
        found.consumers.append(consumer)
        self.consumers.append(consumer)
        b.record("subscribe", queue, detail=tag)
        b.dispatch(found)
        return consumer

    def close(self, why: str = "closed") -> None:
        if self.closed:
            return
        self.closed = True
        for consumer in list(self.consumers):
            consumer.close(f"connection {why}")
        pending, self._pending = self._pending, {}
        for future, _ in pending.values():
            if not future.done():
                future.set_exception(BrokerDown(f"{self.name} {why} before the confirm"))
        self.broker.connection_closed(self, why)
        for callback in self._on_close:
            callback(why)


class Consumer:
    """A consumer on a channel of its own: cancelling it closes the channel, so what it holds
    unsettled goes back to its queue (counted, as a connection loss is)."""

    def __init__(
        self, connection: Connection, queue: SimQueue[Consumer], callback: Callback,
        prefetch: int, tag: str,
    ) -> None:  # fmt: skip
        self.connection = connection
        self.broker = connection.broker
        self.queue = queue
        self.callback = callback
        self.prefetch = prefetch
        self.tag = tag
        self.closed = False
        self.unacked: dict[int, Stored] = {}  # by delivery tag, in the order handed out
        self._tags = itertools.count(1)
        self._last = 0.0
        self._on_close: list[Closed] = []

    def __repr__(self) -> str:
        return f"Consumer({self.tag} on {self.queue.name}{', closed' if self.closed else ''})"

    @property
    def has_room(self) -> bool:
        return not self.closed and (self.prefetch <= 0 or len(self.unacked) < self.prefetch)

    def add_close_callback(self, callback: Closed) -> None:
        self._on_close.append(callback)

    def hand(self, stored: Stored) -> None:
        """Hand ``stored`` over: it is this consumer's from now, and its callback sees it one
        network hop later (after every delivery handed over before it)."""
        tag = next(self._tags)
        self.unacked[tag] = stored
        delivery = FakeDelivery(stored, self, self.tag, tag, self.queue.kind)
        self._last = self.broker.schedule(self._last, self._arrive, tag, delivery)

    def _arrive(self, tag: int, delivery: FakeDelivery) -> None:
        if self.closed:
            return  # given back when it closed
        self.broker.record("deliver", self.queue.name, self.unacked[tag], f"{self.tag} tag {tag}")
        task = asyncio.ensure_future(self.callback(delivery))
        task.add_done_callback(self.broker.callback_done)

    def settle(self, tag: int, verb: Verb, *, multiple: bool, requeue: bool) -> None:
        if self.closed:
            raise ChannelGone(f"{verb} of tag {tag}: the channel of {self.tag} is closed")
        if tag not in self.unacked:
            self.close(f"unknown delivery tag {tag}")
            raise UnknownDeliveryTag(f"{verb} of tag {tag}: unknown delivery tag")
        tags = [t for t in self.unacked if t <= tag] if multiple else [tag]
        by = f"{self.tag} tag {tag}{' multiple' if multiple else ''}"
        for t in tags:
            self.broker.settled(self.queue, self.unacked.pop(t), verb, requeue, by)
        self.broker.dispatch(self.queue)

    def cancel(self) -> None:
        self.close("cancelled")

    def close(self, why: str) -> None:
        if self.closed:
            return
        self.closed = True
        self.queue.consumers.remove(self)
        self.connection.consumers.remove(self)
        self.broker.record("cancel", self.queue.name, detail=f"{self.tag} {why}")
        held, self.unacked = self.unacked, {}
        for stored in held.values():  # in tag order: they go back in the order delivered
            self.broker.give_back(self.queue, stored, counted=True, why=why)
        for callback in self._on_close:
            callback(why)
        self.broker.dispatch(self.queue)  # a standby consumer takes over
