"""An in-memory RabbitMQ on the virtual loop (``saga_app.sim.loop``), with the semantics this
system relies on (docs/explanation/design.md, "RabbitMQ and Postgres facts"), driven by
one seeded ``random.Random``.

- **Topology.** The exchanges, queues and bindings ``Topology.declare`` declares, each queue
  from the same AMQP arguments (``queues.queues_of``): the commands exchange is a topic
  exchange routing ``saga.*.N`` to partition N and ``saga.*``/``dlq.*`` to the intake; the
  partitions and the intake are quorum queues with a single active consumer, an explicit
  ``x-delivery-limit`` and at-least-once dead-lettering to the fanout dead-letter exchange;
  the action queues the same without single active consumer; the request queues classic and
  non-durable, without a limit or dead-lettering, and ``declare`` declares again whatever of
  the topology is missing. The default exchange routes to
  the queue named by the key. Client queues (replies, event listeners) are declared and bound
  by ``declare_client_queue`` and ``bind``.
- **Publishing.** ``Connection.send`` raises at once while the broker is down (or the
  connection closed), for a missing exchange, and for a ``user_id`` other than the
  connection's (RabbitMQ validates it: the trust model rests on that). Otherwise the publish
  reaches the broker one network hop later, in order per connection, and its confirm reaches
  the publisher a hop after that: a mandatory publish no queue took comes back as
  ``Unroutable``; a non-mandatory one is dropped.
- **Queues.** FIFO; a message given back (``reject(requeue=True)``, or held by a consumer
  that went away) goes before every message not yet delivered, as a quorum queue's returns
  do, so later messages wait behind it. Reject and a lost consumer raise its delivery count;
  ``nack`` does not (RabbitMQ 4.3; ``BrokerConfig.nack_counts`` for older). ``x-delivery-count``
  is absent on the first delivery (3.12+) and present from the first counted redelivery. A
  count above the queue's limit dead-letters the message instead of requeueing it, with
  reason ``delivery_limit``; ``reject(requeue=False)`` dead-letters at once as ``rejected``.
  A dead letter carries ``x-death`` (count, reason, queue, time, exchange, routing-keys),
  ``x-first-death-*`` and ``x-last-death-*``, and keeps its routing key. A quorum queue
  without a limit gets RabbitMQ 4.0's default of 20; past it a message with no dead-letter
  exchange is dropped.
- **Consumers.** Each delivery has a tag per consumer (each consumer is its own channel);
  ``ack(multiple=True)`` covers every tag up to its own; settling a tag the channel does not
  hold closes the channel (PRECONDITION_FAILED), and settling on a closed one raises. A
  single-active-consumer queue delivers only to its oldest live subscriber; when it goes,
  the next takes over, after everything the old one held went back, in order, counted.
  Other queues deliver round robin among consumers with room under their prefetch.
- **Crashes.** ``Connection.close`` (a process stopping or dying: the broker sees the same)
  gives back what its consumers held. ``crash()`` loses the publishes still on their way,
  closes every connection, then loses each message committed within ``loss_window_s`` with
  probability ``loss_probability`` (a SIGKILLed single node was seen losing quorum messages
  confirmed in its last 1-2 s), deletes non-durable queues, and drops transient messages
  from classic queues. Quorum queues keep the rest. ``restart()``: processes connect and
  subscribe again. A publish the broker committed whose confirm was still on its way is
  kept, and its publisher sees ``BrokerDown``: it publishes again, and there are two.
- **Timing.** Every hop (publish, confirm, delivery) takes ``hop_s`` drawn uniformly, FIFO
  per connection and per consumer, no order across queues. Acks, rejects, subscribing and
  declaring take effect at once.
- **Trace.** Every publish, enqueue, return, drop, confirm, delivery, ack, requeue, dead
  letter, loss, subscription, cancel, close, crash and restart is an ``Event`` in ``trace``.

Not modelled: queue length limits (none are set), message TTLs, priorities, ``basic.get``,
exclusive-queue locking, and losing an ack in the crash window (the message would come back).
"""

from __future__ import annotations

import asyncio
import itertools
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple, TypeVarTuple

from saga_app.sim.clients import Connection, Consumer, Publish, Publishable
from saga_app.sim.errors import BrokerDown, NotFound, Unroutable
from saga_app.sim.loop import at as date_at
from saga_app.sim.messages import FakeDelivery, Stored, Verb
from saga_app.sim.queues import Router, SimQueue, death_headers, exchanges_of, queues_of
from saga_shared.transport.topology import Topology

__all__ = [
    "Broker",
    "BrokerConfig",
    "Connection",
    "Consumer",
    "Event",
    "FakeDelivery",
    "Publishable",
]

Ts = TypeVarTuple("Ts")


@dataclass(frozen=True)
class BrokerConfig:
    hop_s: tuple[float, float] = (0.0005, 0.002)  # one network hop, drawn uniformly
    loss_window_s: float = 0.0  # a crash may lose messages committed this recently...
    loss_probability: float = 0.0  # ...each with this probability
    nack_counts: bool = False  # before RabbitMQ 4.3 a requeueing nack raised the count too
    default_delivery_limit: int | None = 20  # RabbitMQ 4.0's for quorum queues; None: 3.x


class Event(NamedTuple):
    at: float  # virtual time
    kind: str
    queue: str = ""
    mid: int = 0  # the broker's number for the publish (0: none)
    message_id: str | None = None
    detail: str = ""


class Broker:
    def __init__(
        self, topology: Topology, rng: random.Random, config: BrokerConfig | None = None
    ) -> None:
        self.topology = topology
        self.rng = rng
        self.config = config or BrokerConfig()
        self.trace: list[Event] = []
        self.callback_errors: list[BaseException] = []  # consumers' callbacks that raised
        self.up = True
        self.router = Router(exchanges_of(topology), topology.bindings(), topology.alternates())
        self.queues: dict[str, SimQueue[Consumer]] = {}
        self._mids = itertools.count(1)
        self._numbers = itertools.count(1)
        self._connections: list[Connection] = []
        # publishes sent and not arrived (a crash loses them): their message ids
        self._in_flight: dict[int, str | None] = {}
        self.declare(first=True)

    # --- time and trace ------------------------------------------------------------------
    @property
    def now(self) -> float:
        return asyncio.get_running_loop().time()

    def record(
        self, kind: str, queue: str = "", stored: Stored | None = None, detail: str = "",
        *, mid: int = 0, message_id: str | None = None,
    ) -> None:  # fmt: skip
        if stored is not None:
            mid, message_id = stored.mid, stored.props.message_id
        self.trace.append(Event(self.now, kind, queue, mid, message_id, detail))

    def schedule(self, after: float, callback: Callable[[*Ts], object], *args: *Ts) -> float:
        """Run ``callback`` one hop from now, but not before ``after`` (the stream's last);
        the time it runs at."""
        low, high = self.config.hop_s
        when = max(self.now + self.rng.uniform(low, high), after)
        asyncio.get_running_loop().call_at(when, callback, *args)
        return when

    def next_mid(self) -> int:
        return next(self._mids)

    # --- clients -------------------------------------------------------------------------
    def connect(self, user: str | None = None, name: str = "") -> Connection:
        self._check_up()
        connection = Connection(self, next(self._numbers), user, name)
        self._connections.append(connection)
        self.record("connect", detail=connection.name)
        return connection

    @property
    def connections(self) -> tuple[Connection, ...]:
        """The open connections, oldest first."""
        return tuple(self._connections)

    def declare_client_queue(
        self, name: str, *, owner: Connection | None = None, durable: bool = False
    ) -> None:
        """A classic queue of a client's (a reply queue, an event listener's); with an
        ``owner``, exclusive: deleted when that connection closes. Declaring it again is a
        no-op, as in AMQP."""
        self._check_up()
        if name not in self.queues:
            self.queues[name] = SimQueue(name, {}, durable=durable, owner=owner)

    def declare(self, *, first: bool = False) -> None:
        """``Topology.declare``: every queue of the topology that is missing (a non-durable one
        gone with a crash, or deleted), with its bindings; what exists is left as it is."""
        self._check_up()
        bindings = self.topology.bindings()
        for name, args, durable in queues_of(self.topology):
            if name in self.queues:
                continue
            limit = self.config.default_delivery_limit
            self.queues[name] = SimQueue(name, args, durable=durable, default_limit=limit)
            for exchange, pattern, queue in bindings:
                if queue == name:
                    self.router.bind(name, exchange, pattern)
            if not first:
                self.record("declare", name)

    def bind(self, queue: str, exchange: str, pattern: str) -> None:
        self._check_up()
        if queue not in self.queues or not self.router.knows(exchange) or exchange == "":
            raise NotFound(f"cannot bind '{queue}' to '{exchange}': no such queue or exchange")
        self.router.bind(queue, exchange, pattern)

    def delete_queue(self, name: str) -> None:
        """Delete a queue and what it holds; its consumers are cancelled."""
        queue = self.queues.pop(name, None)
        if queue is None:
            return
        self.router.forget(name)
        for consumer in list(queue.consumers):
            consumer.close("queue deleted")
        for stored in queue.keep_only(lambda _: False):
            self.record("dropped", name, stored, "queue deleted")

    def connection_closed(self, connection: Connection, why: str) -> None:
        """``connection`` closed: its exclusive queues go with it."""
        self.record("close", detail=f"{connection.name} {why}")
        if connection in self._connections:
            self._connections.remove(connection)
        for name in [n for n, q in self.queues.items() if q.owner is connection]:
            self.delete_queue(name)

    def depth(self, queue: str) -> int:
        """Messages waiting in ``queue`` (not those in a consumer's hand)."""
        found = self.queues.get(queue)
        return 0 if found is None else len(found)

    def unacked(self, queue: str) -> int:
        found = self.queues.get(queue)
        return 0 if found is None else sum(len(c.unacked) for c in found.consumers)

    def _check_up(self) -> None:
        if not self.up:
            raise BrokerDown("the broker is down")

    # --- messages ------------------------------------------------------------------------
    def arrive(self, connection: Connection, publish: Publish) -> None:
        """A publish reaches the broker: routed, committed, confirmed."""
        if publish.mid not in self._in_flight:
            return  # lost in a crash on its way
        del self._in_flight[publish.mid]
        queues = self.router.route(publish.exchange, publish.routing_key, self.queues)
        error: Exception | None = None
        if not queues:
            kind = "returned" if publish.mandatory else "dropped"
            self.record(kind, mid=publish.mid, message_id=publish.props.message_id,
                        detail=f"{publish.exchange} {publish.routing_key}: no queue")  # fmt: skip
            if publish.mandatory:
                where = publish.exchange or "the default exchange"
                error = Unroutable(f"{where} under '{publish.routing_key}' reached no queue")
        for name in queues:
            self.enqueue(name, Stored(
                publish.mid, publish.body, publish.props, publish.headers, publish.exchange,
                publish.routing_key, self.now,
            ))  # fmt: skip
        connection.confirm(publish.mid, error)

    def sent(self, publish: Publish) -> None:
        self._in_flight[publish.mid] = publish.props.message_id
        detail = f"{publish.exchange} {publish.routing_key}"
        self.record("publish", mid=publish.mid, message_id=publish.props.message_id,
                    detail=detail)  # fmt: skip

    def enqueue(self, name: str, stored: Stored) -> None:
        queue = self.queues[name]
        queue.put(stored)
        self.record("enqueue", name, stored)
        self.dispatch(queue)

    def dispatch(self, queue: SimQueue[Consumer]) -> None:
        """Hand waiting messages to the consumers that may take them, in queue order."""
        if self.queues.get(queue.name) is not queue:
            return  # deleted: its consumers are being cancelled
        while self.up and queue:
            consumer = queue.pick()
            if consumer is None:
                return
            consumer.hand(queue.take())

    def settled(
        self, queue: SimQueue[Consumer], stored: Stored, verb: Verb, requeue: bool, by: str
    ) -> None:
        """``stored`` settled by the consumer, as ``by`` (its tag, or the tag of the
        ``multiple`` settle covering it) says."""
        if verb == "ack":
            self.record("ack", queue.name, stored, by)
        elif requeue:
            counted = verb == "reject" or self.config.nack_counts
            self.give_back(queue, stored, counted=counted, why=f"{verb}ed")
        else:
            self.dead_letter(queue, stored, "rejected")

    def give_back(
        self, queue: SimQueue[Consumer], stored: Stored, *, counted: bool, why: str
    ) -> None:
        if self.queues.get(queue.name) is not queue:
            self.record("dropped", queue.name, stored, "queue deleted")
            return
        stored.redelivered = True
        if counted:
            stored.count += 1
        limit = queue.delivery_limit
        if counted and limit is not None and stored.count > limit:
            self.dead_letter(queue, stored, "delivery_limit")
            return
        queue.give_back(stored)
        self.record("requeue", queue.name, stored, f"{why}, count {stored.count}")

    def dead_letter(self, queue: SimQueue[Consumer], stored: Stored, reason: str) -> None:
        self.record("dead_letter", queue.name, stored, reason)
        exchange = queue.dead_letter_exchange
        targets = []
        if exchange is not None and self.router.knows(exchange):
            targets = self.router.route(exchange, stored.routing_key, self.queues)
        if not targets:
            self.record("dropped", queue.name, stored, f"{reason}: no dead-letter route")
            return
        # AMQP timestamps are whole seconds
        when = date_at(math.floor(self.now))
        headers = death_headers(stored, queue.name, reason, when, stored.exchange)
        for name in targets:
            self.enqueue(name, Stored(
                stored.mid, stored.body, stored.props, headers, exchange or "",
                stored.routing_key, self.now,
            ))  # fmt: skip

    def callback_done(self, task: asyncio.Future[object]) -> None:
        if not task.cancelled() and task.exception() is not None:
            error = task.exception()
            assert error is not None
            self.callback_errors.append(error)
            self.record("callback_error", detail=repr(error))

    # --- crash ---------------------------------------------------------------------------
    def crash(self) -> None:
        """The node dies (SIGKILL): see the module's docstring for what is lost."""
        if not self.up:
            return
        now = self.now
        self.up = False
        self.record("crash")
        lost, self._in_flight = self._in_flight, {}
        for mid, message_id in sorted(lost.items()):
            self.record("lost", mid=mid, message_id=message_id, detail="on its way")
        for connection in list(self._connections):
            connection.close("lost: the broker crashed")
        self._lose_recent(now)
        for name, queue in list(self.queues.items()):
            if not queue.durable:
                self.delete_queue(name)
            elif queue.kind != "quorum":
                for stored in queue.keep_only(lambda s: s.props.persistent):
                    self.record("lost", name, stored, "transient")

    def _lose_recent(self, now: float) -> None:
        window, chance = self.config.loss_window_s, self.config.loss_probability
        if window <= 0 or chance <= 0:
            return

        def kept(stored: Stored) -> bool:
            # drawn for the messages in the window only, in queue order: replayable
            return stored.committed_at < now - window or self.rng.random() >= chance

        for name, queue in self.queues.items():
            for stored in queue.keep_only(kept):
                self.record("lost", name, stored, "committed in the crash window")

    def restart(self) -> None:
        """The node is back with its durable queues; nobody is connected."""
        if not self.up:
            self.up = True
            self.record("restart")
