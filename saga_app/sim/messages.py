"""What the simulated broker holds and hands out: a message as published (``Props``), a copy of it
in one queue (``Stored``), and a delivery of it to one consumer (``FakeDelivery``), which is an
``aio_pika.abc.AbstractIncomingMessage`` for every attribute and method the project reads
(``saga_shared.transport.codec``, ``saga_shared.transport.delivery``,
``saga_shared.transport.patience``, the dead-letter ingester)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import Any, Literal, Protocol, cast

import aiormq.abc
import aiormq.exceptions
import pamqp.commands
from aio_pika.abc import AbstractIncomingMessage, AbstractProcessContext, DeliveryMode
from aio_pika.exceptions import MessageProcessError

Verb = Literal["ack", "reject", "nack"]
PERSISTENT = 2  # AMQP delivery mode


@dataclass(frozen=True, slots=True)
class Props:
    """The AMQP properties of a publish, but its headers (which dead-lettering rewrites)."""

    message_id: str | None = None
    type: str | None = None
    user_id: str | None = None
    content_type: str | None = None
    content_encoding: str | None = None
    correlation_id: str | None = None
    reply_to: str | None = None
    timestamp: datetime | None = None
    app_id: str | None = None
    delivery_mode: int = 1
    priority: int | None = None

    @classmethod
    def of(cls, p: pamqp.commands.Basic.Properties) -> Props:
        return cls(
            p.message_id, p.message_type, p.user_id, p.content_type, p.content_encoding,
            p.correlation_id, p.reply_to, p.timestamp, p.app_id, p.delivery_mode or 1, p.priority,
        )  # fmt: skip

    @property
    def persistent(self) -> bool:
        return self.delivery_mode == PERSISTENT


@dataclass(eq=False, slots=True)
class Stored:
    """One message in one queue (a publish routed to two queues is two of these)."""

    mid: int  # the broker's number for the publish it came from
    body: bytes
    props: Props
    headers: dict[str, Any]
    exchange: str
    routing_key: str
    committed_at: float  # when the broker took it (virtual time): the crash loss window's clock
    count: int = 0  # failed deliveries so far: x-delivery-count
    redelivered: bool = False  # handed out before and given back


class Settler(Protocol):
    """The consumer a delivery came through (``broker.Consumer``)."""

    @property
    def closed(self) -> bool: ...

    def settle(self, tag: int, verb: Verb, *, multiple: bool, requeue: bool) -> None: ...


class _ChannelView:
    """What a delivery's ``channel`` is asked: whether it can still be settled."""

    def __init__(self, consumer: Settler) -> None:
        self._consumer = consumer

    @property
    def is_closed(self) -> bool:
        return self._consumer.closed


class FakeDelivery(AbstractIncomingMessage):
    """One delivery, as aio-pika's ``IncomingMessage``. Settling it twice raises
    ``MessageProcessError`` at once, as aio-pika does; settling a tag the broker no longer
    holds (acked by another's ``multiple=True``) is the broker's channel error."""

    def __init__(
        self, stored: Stored, consumer: Settler, consumer_tag: str, tag: int, queue_type: str
    ) -> None:
        p = stored.props
        self.body = stored.body
        self.body_size = len(stored.body)
        headers = dict(stored.headers)
        # A quorum queue adds its count from the first redelivery on (3.12+: absent before).
        if queue_type == "quorum" and stored.count > 0:
            headers["x-delivery-count"] = stored.count
        self.headers = headers
        self.content_type, self.content_encoding = p.content_type, p.content_encoding
        self.delivery_mode = DeliveryMode(p.delivery_mode)
        self.priority = p.priority or 0
        self.correlation_id, self.reply_to = p.correlation_id, p.reply_to
        self.expiration = None
        self.message_id, self.timestamp, self.type = p.message_id, p.timestamp, p.type
        self.user_id, self.app_id, self.cluster_id = p.user_id, p.app_id, None
        self.consumer_tag, self.delivery_tag = consumer_tag, tag
        self.redelivered, self.message_count = stored.redelivered, None
        self.routing_key, self.exchange = stored.routing_key, stored.exchange
        self._consumer = consumer
        self._processed = False
        self._locked = False

    def __repr__(self) -> str:
        return f"FakeDelivery({self.type} {self.message_id}, tag {self.delivery_tag})"

    async def ack(self, multiple: bool = False) -> None:
        self._settle("ack", multiple=multiple, requeue=False)

    async def reject(self, requeue: bool = False) -> None:
        self._settle("reject", multiple=False, requeue=requeue)

    async def nack(self, multiple: bool = False, requeue: bool = True) -> None:
        self._settle("nack", multiple=multiple, requeue=requeue)

    def _settle(self, verb: Verb, *, multiple: bool, requeue: bool) -> None:
        if self._processed:
            raise MessageProcessError("Message already processed", self)
        assert self.delivery_tag is not None
        self._consumer.settle(self.delivery_tag, verb, multiple=multiple, requeue=requeue)
        self._processed = self._locked = True

    @property
    def processed(self) -> bool:
        return self._processed

    @property
    def locked(self) -> bool:
        return self._locked

    def lock(self) -> None:
        self._locked = True

    @property
    def channel(self) -> aiormq.abc.AbstractChannel:
        # Only ``is_closed`` is read of it; the cast keeps the consumer's code typed as it is.
        return cast(aiormq.abc.AbstractChannel, _ChannelView(self._consumer))

    @property
    def properties(self) -> pamqp.commands.Basic.Properties:
        return pamqp.commands.Basic.Properties(
            content_type=self.content_type, content_encoding=self.content_encoding,
            headers=dict(self.headers), delivery_mode=self.delivery_mode.value,
            priority=self.priority, correlation_id=self.correlation_id, reply_to=self.reply_to,
            message_id=self.message_id, timestamp=self.timestamp, message_type=self.type,
            user_id=self.user_id, app_id=self.app_id,
        )  # fmt: skip

    def __iter__(self) -> Iterator[int]:
        return iter(self.body)

    def process(
        self,
        requeue: bool = False,
        reject_on_redelivered: bool = False,
        ignore_processed: bool = False,
    ) -> AbstractProcessContext:
        return _Process(self, requeue, reject_on_redelivered, ignore_processed)


class _Process(AbstractProcessContext):
    """aio-pika's ``message.process()``: ack on success, else reject (without requeue by
    default, which dead-letters at once)."""

    def __init__(
        self, message: FakeDelivery, requeue: bool, on_redelivered: bool, ignore_processed: bool
    ) -> None:
        self.message = message
        self.requeue = requeue
        self.on_redelivered = on_redelivered
        self.ignore_processed = ignore_processed

    async def __aenter__(self) -> AbstractIncomingMessage:
        return self.message

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        if self.ignore_processed and self.message.processed:
            return
        if exc_type is None:
            await self.message.ack()
            return
        try:
            requeue = self.requeue and not (self.on_redelivered and self.message.redelivered)
            await self.message.reject(requeue=requeue)
        except aiormq.exceptions.ChannelInvalidStateError:
            pass  # the channel is gone: the broker gives it back; the block's error stands
