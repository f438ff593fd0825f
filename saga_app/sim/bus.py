"""What the project's code asks of ``saga_shared.transport.bus.Bus``, on a simulated connection: the
adapter framework (``for_outcome``, ``publish_many`` through ``saga_shared.transport.patience``)
and the gatekeeper (``publish``) run unchanged over the simulated broker."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from saga_app.sim.clients import Connection, Publishable
from saga_app.sim.errors import BrokerDown
from saga_shared.config import Settings
from saga_shared.model.messages import Envelope, Outbound
from saga_shared.transport.codec import message_to_amqp
from saga_shared.transport.topology import Topology

Item = tuple[str, str, Publishable]


class SimBus:
    def __init__(
        self, connection: Connection, topology: Topology, settings: Settings,
        before: Callable[[], Awaitable[None]] | None = None,
    ) -> None:  # fmt: skip
        """``before``: awaited before each batch of publishes (a frozen process holds)."""
        self.connection = connection
        self.topology = topology
        self.settings = settings
        self.user = connection.user
        self.before = before

    def for_partition(self, message: Envelope, headers: dict[str, Any] | None = None) -> Item:
        key = self.topology.partition_key(message.order_id)
        return self.topology.partitions_exchange, key, message_to_amqp(message, headers)

    def for_outcome(self, message: Envelope, headers: dict[str, Any] | None = None) -> Item:
        key = self.topology.partition_key(message.order_id)
        exchange = self.topology.answer_exchange(message.type)
        return exchange, key, message_to_amqp(message, headers)

    def _mandatory(self, exchange: str) -> bool:
        return exchange not in ("", self.topology.events_exchange)

    def send(self, exchange: str, routing_key: str, message: Publishable) -> asyncio.Future[None]:
        """Publish as this connection's user (RabbitMQ checks the ``user_id``); the future is
        the confirm. Raises at once when nothing can be sent."""
        message.properties.user_id = self.user
        return self.connection.send(
            exchange, routing_key, message, mandatory=self._mandatory(exchange)
        )

    async def publish_many(
        self, items: Sequence[Item], *, local: Sequence[bool] = ()
    ) -> list[BaseException | None]:
        """Every item sent in order, then each confirm awaited: per item None or the error
        (``local`` is the real bus's hand-off, which the simulation does not have)."""
        if self.before is not None:
            await self.before()
        sent: list[asyncio.Future[None] | BaseException] = []
        for exchange, routing_key, message in items:
            try:
                sent.append(self.send(exchange, routing_key, message))
            except Exception as exc:
                sent.append(exc)
        results: list[BaseException | None] = []
        for future in sent:
            if isinstance(future, BaseException):
                results.append(future)
                continue
            try:
                await asyncio.wait_for(future, self.settings.publish_timeout_s)
                results.append(None)
            except Exception as exc:
                results.append(exc)
        return results

    async def declare(self, *, requests: bool = True) -> None:
        """``Bus.declare``: whatever of the topology is missing, declared again."""
        if self.connection.closed:
            raise BrokerDown(f"{self.connection.name}: closed")
        self.connection.broker.declare()

    async def publish_raw(
        self, exchange: str, routing_key: str, message: Publishable, *, mandatory: bool = True
    ) -> None:
        """(Every publish of the project's to an exchange but the events' is mandatory.)"""
        [error] = await self.publish_many([(exchange, routing_key, message)])
        if error is not None:
            raise error

    async def publish(
        self, exchange: str, routing_key: str, message: Outbound,
        headers: dict[str, Any] | None = None,
    ) -> None:  # fmt: skip
        await self.publish_raw(exchange, routing_key, message_to_amqp(message, headers))
