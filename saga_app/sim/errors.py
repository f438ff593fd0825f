"""What the simulated broker raises: aiormq's own exception types where RabbitMQ would make
aiormq raise them, so the project's handling (``saga_shared.transport.patience``,
``saga_shared.transport.bus.unroutable``,
``aio_pika.exceptions.CONNECTION_EXCEPTIONS``) treats them as it treats the real ones."""

from __future__ import annotations

import aiormq.exceptions

from saga_shared.transport.memory_bus import Unroutable

__all__ = [
    "BrokerDown",
    "ChannelGone",
    "NotFound",
    "UnknownDeliveryTag",
    "Unroutable",
    "UserIdMismatch",
]


class BrokerDown(aiormq.exceptions.AMQPConnectionError):
    """The broker is down, or this connection to it is closed: connect again and retry."""


class ChannelGone(aiormq.exceptions.ChannelInvalidStateError):
    """A delivery settled after its channel closed (its consumer cancelled, its connection
    or the broker gone): the broker has given the message back already."""


class UnknownDeliveryTag(aiormq.exceptions.ChannelPreconditionFailed):
    """PRECONDITION_FAILED: a tag the channel does not hold (already acked, for one by an
    ack with ``multiple=True``); RabbitMQ closes the channel."""


class UserIdMismatch(aiormq.exceptions.ChannelPreconditionFailed):
    """PRECONDITION_FAILED: a publish whose ``user_id`` is not the connection's user."""


class NotFound(aiormq.exceptions.ChannelNotFoundEntity):
    """NOT_FOUND: no such exchange or queue."""
