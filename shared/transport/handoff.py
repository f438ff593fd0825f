"""The in-process hand-off (``SAGA_HANDOFF=in-process``): a request or an outcome whose consumer
runs in the publishing process is handed to it there, without the broker.

Only the two kinds of message that the broker keeps in classic, transient queues go this way:
action requests (the register holds them, and a step's deadline or a resend sends them again)
and outcomes of requests (the adapter's key record holds them, and answers a resend). Losing
one costs what losing its classic queue costs: a resend, never a saga. Commands, settles, dead
letters and events still go through the broker, on quorum queues where they are durable.

A hand-off skips the broker's stamp of who sent a message (rule 11): it is refused unless the
process runs every component as one account (``SAGA_IDENTITY=shared``), where that stamp
tells the components nothing anyway (``saga_app.stack``).

A delivery handed over settles like one from the broker, with one difference: whatever is not
an ack (a retry, a dead letter) sends it the broker's way, to the exchange and routing key it
was published to, where the queue's own rules (redelivery, the delivery count, burial) apply.
So do the deliveries a stopping consumer had not started. If the broker cannot take it then,
it is lost as a classic queue's messages are lost with their node: its step's deadline or the
watch's resend sends it again."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import pamqp.commands
from aio_pika.message import IncomingMessage
from aiormq.abc import DeliveredMessage
from pamqp.header import ContentHeader

from saga_shared.observability import metrics
from saga_shared.transport.codec import Outgoing
from saga_shared.transport.topology import Topology

log = logging.getLogger(__name__)

# Publishes through the broker, with a confirm (``Bus.publish_raw``).
Away = Callable[[str, str, Outgoing], Awaitable[None]]
Take = Callable[["LocalDelivery"], None]


class Taker:
    """One consumer's subscription to a queue, as the hand-off sees it: its consumer tag (so
    the consumer tells which of its queues a delivery is for), the function that takes a
    delivery in, and whether it still does (``is_closed``: the deliveries' channel, as a
    delivery's ``channel`` tells whether it can still be settled)."""

    def __init__(self, queue: str, consumer_tag: str, take: Take, takers: dict[str, Taker]) -> None:
        self.queue = queue
        self.consumer_tag = consumer_tag
        self.take = take
        self.is_closed = False
        self._takers = takers

    def close(self) -> None:
        """Take nothing more (the consumer stops): later publishes go through the broker."""
        self.is_closed = True
        if self._takers.get(self.queue) is self:
            del self._takers[self.queue]


class LocalDelivery(IncomingMessage):
    """A message handed over in this process, with the attributes a broker's delivery has (no
    delivery tag: an ack with ``multiple`` covers nothing but itself)."""

    __slots__ = ("_away", "_settled")

    def __init__(self, message: DeliveredMessage, away: Away) -> None:
        super().__init__(message)
        self._away = away
        self._settled = False

    @property
    def processed(self) -> bool:
        return self._settled

    async def ack(self, multiple: bool = False) -> None:
        self._settled = True

    async def reject(self, requeue: bool = False) -> None:
        await self._to_broker()

    async def nack(self, multiple: bool = False, requeue: bool = True) -> None:
        await self._to_broker()

    async def _to_broker(self) -> None:
        """Not finished here: the broker's way, once (a second settle is a no-op, as aio-pika's
        is an error)."""
        if self._settled:
            return
        self._settled = True
        outgoing = Outgoing(self.body, self.properties)
        try:
            await self._away(self.exchange or "", self.routing_key or "", outgoing)
        except Exception as exc:
            log.warning("message %s (%s) could not go the broker's way (%r): lost as with its "
                        "queue; its step's deadline sends the request again", self.message_id,
                        self.type, exc)  # fmt: skip


class Handoff:
    """Which queues a consumer in this process takes, and handing messages to them."""

    def __init__(self, topology: Topology, away: Away) -> None:
        self.topology = topology
        self._away = away
        self._takers: dict[str, Taker] = {}

    def attach(self, queue: str, consumer_tag: str, take: Take) -> Taker | None:
        """Hand ``queue``'s messages to ``take`` until the taker is closed; None: not a queue
        the hand-off serves (only request and outcome queues are)."""
        if not self.topology.is_transient_queue(queue):
            return None
        taker = self._takers[queue] = Taker(queue, consumer_tag, take, self._takers)
        return taker

    def queue_of(self, exchange: str, routing_key: str) -> str | None:
        """The transient queue a publish to ``exchange`` with ``routing_key`` reaches, if any."""
        topology = self.topology
        if topology.is_request_route(exchange, routing_key):
            return topology.request_queue(routing_key.removeprefix("request."))
        if exchange == topology.outcomes_exchange and routing_key.isdigit():
            index = int(routing_key)
            return topology.outcome_queue(index) if index < topology.partitions else None
        return None

    def take(self, exchange: str, routing_key: str, message: Outgoing, user: str | None) -> bool:
        """Hand the message to this process's consumer of its queue; False: none here."""
        queue = self.queue_of(exchange, routing_key)
        taker = self._takers.get(queue) if queue is not None else None
        if taker is None:
            return False
        properties = message.properties
        properties.user_id = user  # as the broker would have checked and kept it
        deliver = pamqp.commands.Basic.Deliver(
            consumer_tag=taker.consumer_tag, delivery_tag=0, redelivered=False,
            exchange=exchange, routing_key=routing_key,
        )  # fmt: skip
        header = ContentHeader(body_size=len(message.body), properties=properties)
        delivered = DeliveredMessage(deliver, header, message.body, taker)  # type: ignore[arg-type]
        taker.take(LocalDelivery(delivered, self._away))
        metrics.HANDED_OVER.labels(queue).inc()
        return True


def is_local(message: object) -> bool:
    return isinstance(message, LocalDelivery)
