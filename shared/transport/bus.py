"""The one I/O boundary to RabbitMQ: connect, declare, publish with confirms, consume."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import aio_pika
import aiormq
import pamqp.commands
from aio_pika.abc import (
    AbstractChannel,
    AbstractRobustConnection,
)

from saga_shared.addresses import with_default_query
from saga_shared.amqp_internals import batch, frames, incoming, wire
from saga_shared.config import Settings, masked
from saga_shared.model.messages import Envelope, Outbound
from saga_shared.security.identity import amqp_url_for, user_of_url
from saga_shared.transport.cluster_connection import connect_cluster
from saga_shared.transport.codec import Outgoing, message_to_amqp
from saga_shared.transport.consumer import consume
from saga_shared.transport.handoff import Handoff
from saga_shared.transport.ports import Publisher
from saga_shared.transport.topology import Topology

log = logging.getLogger(__name__)

# What ``Bus`` publishes: the codec's messages, or aio-pika's own (tools, tests).
Publishable = Outgoing | aio_pika.Message
Item = tuple[str, str, Publishable]  # exchange, routing key, message


def refused_for_now(error: BaseException) -> bool:
    """A nack: the broker took the publish and refused it for now (a quorum queue without a
    majority of its nodes, or full); the same publish may well succeed later."""
    return isinstance(error, aiormq.exceptions.DeliveryError) and isinstance(
        error.frame, pamqp.commands.Basic.Nack
    )


def unroutable(error: BaseException) -> bool:
    """A publish that can never succeed: no such exchange, or no queue took it (returned)."""
    if isinstance(error, aiormq.exceptions.ChannelNotFoundEntity):
        return True
    return isinstance(error, aiormq.exceptions.DeliveryError) and isinstance(
        error.frame, pamqp.commands.Basic.Return
    )


class Bus:
    """``user``: connect as this broker user (its password from the secrets directory); by
    default, as ``SAGA_AMQP_URL`` says. Every publish carries the user as ``user_id``, which the
    broker checks: the receivers know who sent it."""

    def __init__(self, settings: Settings, user: str | None = None) -> None:
        self.settings = settings
        self.topology = Topology.from_settings(settings)
        self.url = settings.amqp_url if user is None else amqp_url_for(settings, user)
        self.user = user_of_url(self.url)
        # The broker drops a connection silent for two heartbeat intervals, and its consumers
        # pass on: with half the lease, a frozen coordinator's queues pass when its locks do
        # (aio-pika's 60 s held its partitions for over 90 s). The URL's own ``heartbeat=`` wins.
        beat = str(max(1, round(settings.lease_s / 2)))
        self._connect_url = with_default_query(self.url, "heartbeat", beat)
        self._connection: AbstractRobustConnection | None = None
        self._publisher: AbstractChannel | None = None
        self._proven: set[str] = set()  # exchanges a publish reached (see publish_many)
        # Where a publish to an exchange not proven yet goes, one at a time (``_publish_apart``).
        self._apart: AbstractChannel | None = None
        self._apart_lock = asyncio.Lock()
        # Set by a process that runs its consumers beside its publishers in one account
        # (``saga_app.stack``, ``SAGA_HANDOFF=in-process``): requests and outcomes for them
        # are handed over here, never published.
        self.handoff: Handoff | None = None
        self._reconnect_listeners: list[Callable[[], object]] = []

    def hand_over(self) -> Handoff:
        """Hand requests and outcomes to this process's own consumers from now on."""
        if self.handoff is None:
            self.handoff = Handoff(self.topology, self.publish_raw)
        return self.handoff

    async def connect(self) -> None:
        frames.install(self.settings.coalesce_frames)
        wire.install(self.settings.fast_frames)
        incoming.install(self.settings.fast_frames)
        # Which process holds the connection, as the broker's connection list shows it.
        name = f"saga {self.user} {socket.gethostname()}:{os.getpid()}"
        self._connection = await connect_cluster(
            self._connect_url, client_properties={"connection_name": name}
        )
        self._connection.reconnect_callbacks.add(self._connected_again)
        self._publisher = await self._connection.channel(
            publisher_confirms=True, on_return_raises=True
        )

    def on_reconnect(self, listener: Callable[[], object]) -> None:
        """Call ``listener`` each time the connection is made again after a drop: what the
        broker held meanwhile is unknown (a restart deletes the transient queues)."""
        self._reconnect_listeners.append(listener)

    def _connected_again(self, connection: AbstractRobustConnection | None) -> None:
        # aio-pika says when a connection drops, not when it is back: the end of an outage. The
        # URL is the node reached (on a cluster, maybe another than before).
        log.info("connected to the broker again (%s)", masked(str(getattr(connection, "url", ""))))
        for listener in self._reconnect_listeners:
            listener()

    @property
    def connected(self) -> bool:
        return self._connection is not None

    async def close(self) -> None:
        if self._connection is not None:
            await self._connection.close()
            self._connection = None

    async def __aenter__(self) -> Bus:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def connection(self) -> AbstractRobustConnection:
        if self._connection is None:
            raise RuntimeError("Bus is not connected")
        return self._connection

    async def _look_channel(self) -> AbstractChannel:
        """A channel for one look (declares, passive declares), not a robust one: the broker
        closes a channel whose passive declare finds no queue, and a robust channel then opens
        itself again, unseen, which leaked a channel per missing queue per look."""
        return await aio_pika.Channel(self.connection, publisher_confirms=False)

    async def declare(self, *, requests: bool = True) -> None:
        channel = await self._look_channel()
        try:
            await self.topology.declare(channel, requests=requests)
        finally:
            await _close_quietly(channel)

    async def depths(self, names: Sequence[str] | None = None) -> dict[str, QueueDepth | None]:
        """Each queue's messages ready and consumers (by default the topology's), by a passive
        declare, which needs no permission; None for a queue that does not exist (or did not
        answer). A missing queue makes the broker close the channel: only then is another
        opened."""
        found: dict[str, QueueDepth | None] = {}
        channel: AbstractChannel | None = None
        try:
            for name in self.topology.all_queues() if names is None else names:
                if channel is None or channel.is_closed:
                    channel = await self._look_channel()
                try:
                    ok = await channel.declare_queue(name, passive=True, timeout=5)
                    result = ok.declaration_result
                    found[name] = QueueDepth(result.message_count or 0, result.consumer_count or 0)
                except (aio_pika.exceptions.AMQPError, ConnectionError, TimeoutError):
                    found[name] = None
        finally:
            if channel is not None:
                await _close_quietly(channel)
        return found

    async def missing(self, names: Sequence[str]) -> list[str]:
        """The queues of ``names`` the broker says do not exist (a passive declare answered
        NOT_FOUND); any other failure raises: a queue that did not answer is not called gone."""
        gone: list[str] = []
        channel: AbstractChannel | None = None
        try:
            for name in names:
                if channel is None or channel.is_closed:
                    channel = await self._look_channel()
                try:
                    await channel.declare_queue(name, passive=True, timeout=5)
                except aiormq.exceptions.ChannelNotFoundEntity:
                    gone.append(name)  # the broker closed the channel: the next one opens anew
        finally:
            if channel is not None:
                await _close_quietly(channel)
        return gone

    async def _channel(self) -> tuple[AbstractChannel, aiormq.Channel]:
        """The publishing channel, and aiormq's channel under it."""
        if self._publisher is None:
            raise RuntimeError("Bus is not connected")
        if self._publisher.is_closed:
            # The broker closes a channel on some errors (a publish to a deleted exchange):
            # reopen it so one bad message does not stop every later publish.
            await self._publisher.reopen()
        underlay = await self._publisher.get_underlay_channel()
        # The concrete class: its basic_publish takes ``wait``, the abstract one's does not.
        return self._publisher, cast(aiormq.Channel, underlay)

    def _send(
        self,
        underlay: aiormq.Channel,
        exchange: str,
        routing_key: str,
        message: Publishable,
        mandatory: bool,
    ) -> Awaitable[object]:
        """What aio-pika's ``Exchange.publish`` does, but without waiting for the frame to be
        written before the next publish on the channel may queue its own (aiormq's ``wait``): a
        batch's frames then go out in one write (``saga_shared.amqp_internals.frames``), and what is
        awaited is the broker's confirm, as before (a return or a nack still raises)."""
        return underlay.basic_publish(
            message.body, exchange=exchange, routing_key=routing_key,
            properties=self._stamped(message), mandatory=mandatory,
            timeout=self.settings.publish_timeout_s, wait=False,
        )  # fmt: skip

    def _stamped(self, message: Publishable) -> pamqp.commands.Basic.Properties:
        properties = message.properties  # aio-pika's Message builds a new one on each read
        properties.user_id = self.user
        return properties

    async def publish_raw(
        self,
        exchange: str,
        routing_key: str,
        message: Publishable,
        *,
        mandatory: bool | None = None,
    ) -> None:
        """Publish and wait for the broker's confirm. Work routes (partitions, actions) must reach
        a queue, so they are mandatory: an unroutable message raises instead of vanishing."""
        must = self._mandatory(exchange) if mandatory is None else mandatory
        if exchange not in self._proven:
            await self._publish_apart(exchange, routing_key, message, must)
            self._proven.add(exchange)
            return
        channel, underlay = await self._channel()
        try:
            await self._send(underlay, exchange, routing_key, message, must)
        except aiormq.exceptions.DeliveryError as exc:
            await self._after_refusal(channel, [exc])
            raise

    async def _publish_apart(
        self, exchange: str, routing_key: str, message: Publishable, mandatory: bool
    ) -> None:
        """A publish to an exchange no publish has reached yet goes on a channel of its own, one
        at a time: were the exchange missing, the broker closes that channel, and a frame
        another publisher (the sender, the relay) had sent behind it on a shared one would turn
        that into closing the whole connection (seen in CI: the relay publishing a row for a
        deleted exchange while the sender published on the same channel)."""
        async with self._apart_lock:
            if self._apart is None:
                self._apart = await self.connection.channel(
                    publisher_confirms=True, on_return_raises=True
                )
            elif self._apart.is_closed:
                await self._apart.reopen()
            underlay = cast(aiormq.Channel, await self._apart.get_underlay_channel())
            try:
                await underlay.basic_publish(
                    message.body, exchange=exchange, routing_key=routing_key,
                    properties=self._stamped(message), mandatory=mandatory,
                    timeout=self.settings.publish_timeout_s,
                )  # fmt: skip
            except aiormq.exceptions.DeliveryError as exc:
                await self._after_refusal(self._apart, [exc])
                raise

    async def _after_refusal(
        self, channel: AbstractChannel | None, errors: Sequence[BaseException | None]
    ) -> None:
        """A nack (not a return): the broker refused for now. RabbitMQ 3.10 keeps nacking every
        later publish of that channel to a quorum queue that was without a majority for a
        while, even once the queue is back (seen in tests/integration/test_cluster.py; a
        new channel publishes at once): so the next publish goes on a new channel."""
        nacked = any(e is not None and refused_for_now(e) for e in errors)
        if not nacked or channel is None:
            return
        if channel is self._publisher:
            log.warning("the broker nacked a publish: publishing on a new channel")
            self._publisher = await self.connection.channel(
                publisher_confirms=True, on_return_raises=True
            )
        elif channel is self._apart:
            self._apart = None  # the next publish apart opens a new one
        else:
            return  # another publish replaced the channel already
        with contextlib.suppress(Exception):
            await channel.close()

    def _taken_here(self, exchange: str, routing_key: str, message: Publishable) -> bool:
        if self.handoff is None or not isinstance(message, Outgoing):
            return False
        return self.handoff.take(exchange, routing_key, message, self.user)

    def _mandatory(self, exchange: str) -> bool:
        return exchange not in ("", self.topology.events_exchange)

    async def publish_many(
        self, items: Sequence[Item], *, local: Sequence[bool] = ()
    ) -> list[BaseException | None]:
        """Publish a batch, each in the list's order, and say per item ``None`` (confirmed) or
        the error. Publishes to exchanges that have confirmed one before are pipelined: one
        confirm round trip for the lot. A publish to any other exchange goes alone: were the
        exchange missing, the broker would close the channel, and a publish already sent
        behind it would turn that into closing the whole connection.

        ``local``: per item, whether a consumer of this process may take it instead
        (``hand_over``); one it takes is not published, and is reported confirmed."""
        if self.handoff is None or not any(local):
            return await self._publish_many(items)
        flags = [*local, *[False] * (len(items) - len(local))]
        here = [flag and self._taken_here(*item) for item, flag in zip(items, flags, strict=True)]
        left = iter(
            await self._publish_many([i for i, h in zip(items, here, strict=True) if not h])
        )
        return [None if h else next(left) for h in here]

    async def _publish_many(self, items: Sequence[Item]) -> list[BaseException | None]:
        results: list[BaseException | None] = []
        run: list[Item] = []
        for item in items:
            if item[0] in self._proven:
                run.append(item)
                continue
            results += await self._pipeline(run)
            run = []
            results += await self._pipeline([item])
        return results + await self._pipeline(run)

    async def _pipeline(self, items: Sequence[Item]) -> list[BaseException | None]:
        if len(items) <= 1:
            try:
                for item in items:
                    await self.publish_raw(*item)
                return [None] * len(items)
            except Exception as exc:
                return [exc]
        # The channel first (a closed one is reopened here, once): then the publishes are
        # queued in the list's order, which is the order on the wire.
        channel, underlay = await self._channel()
        publishes = [
            (exchange, routing_key, message.body, self._stamped(message), self._mandatory(exchange))
            for exchange, routing_key, message in items
        ] if self.settings.fast_frames else []  # fmt: skip
        if publishes and all(properties.message_id for _, _, _, properties, _ in publishes):
            errors = await batch.publish(underlay, publishes, self.settings.publish_timeout_s)
            if any(errors):
                await self._after_refusal(channel, errors)
            return errors
        # Each publish runs straight to aiormq's channel lock (FIFO), which queues its frames
        # before the next one's.
        done = await asyncio.gather(
            *(
                self._send(underlay, exchange, routing_key, message, self._mandatory(exchange))
                for exchange, routing_key, message in items
            ),
            return_exceptions=True,
        )
        errors = [r if isinstance(r, BaseException) else None for r in done]
        if any(errors):
            await self._after_refusal(channel, errors)
        return errors

    async def publish(
        self,
        exchange: str,
        routing_key: str,
        message: Outbound,
        headers: dict[str, Any] | None = None,
    ) -> None:
        await self.publish_raw(exchange, routing_key, message_to_amqp(message, headers))

    def for_partition(self, message: Envelope, headers: dict[str, Any] | None = None) -> Item:
        """``message`` addressed to its order's partition, ready for ``publish_many``."""
        key = self.topology.partition_key(message.order_id)
        return self.topology.partitions_exchange, key, message_to_amqp(message, headers)

    async def to_partition(self, message: Envelope, headers: dict[str, Any] | None = None) -> None:
        await self.publish_raw(*self.for_partition(message, headers))

    def for_outcome(self, message: Envelope, headers: dict[str, Any] | None = None) -> Item:
        """A service's answer addressed to its order's partition (``Topology.answer_exchange``),
        for ``publish_many``."""
        key = self.topology.partition_key(message.order_id)
        exchange = self.topology.answer_exchange(message.type)
        return exchange, key, message_to_amqp(message, headers)

    # Consume until cancelled: ``saga_shared.transport.consumer.consume``, with this bus as its
    # first argument.
    consume = consume


@dataclass(frozen=True)
class QueueDepth:
    messages: int  # ready, not yet delivered
    consumers: int


async def _close_quietly(channel: AbstractChannel) -> None:
    """Close a channel of a look (a declare, a passive declare) whatever happened to it: an error
    closing it must not take the place of the one that ended the look, least of all of a
    cancel (a task that swallowed its cancel that way kept a stop waiting for ever)."""
    if not channel.is_closed:
        with contextlib.suppress(Exception):
            await channel.close()


def _is_a_publisher(bus: Bus) -> Publisher:
    return bus  # mypy checks here that the bus has the interface its twin has
