"""The rows the coordinator's store reads and writes, as values: an outbox row (a message to
publish once its transaction commits), a parked message, and what a claim read."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from saga_coordinator.convoy import OrderView
from saga_coordinator.register import SagaState
from saga_shared.model.messages import Outbound
from saga_shared.transport.codec import Outgoing, to_amqp


@dataclass(frozen=True)
class OutboxRow:
    exchange: str
    routing_key: str
    message_id: str
    message_type: str
    order_id: str
    body: bytes
    headers: dict[str, Any] = field(default_factory=dict)
    # A consumer in this process may take it without the broker (``Bus.hand_over``): only a
    # request's first send, published by the process that wrote it. Not stored: what the relay
    # reads back goes through the broker, as does a resend, where its deliveries are counted
    # (a request that kills its process is buried at the limit instead of looping).
    local: bool = False

    def amqp(self) -> Outgoing:
        return to_amqp(
            self.body, message_id=self.message_id, message_type=self.message_type,
            order_id=self.order_id, headers=self.headers,
        )  # fmt: skip

    @classmethod
    def of(cls, exchange: str, routing_key: str, message: Outbound) -> OutboxRow:
        body = message.model_dump_json().encode()
        order_id = getattr(message, "order_id", None) or ""
        return cls(exchange, routing_key, message.message_id, message.type, order_id, body)


@dataclass(frozen=True)
class Parked:
    id: int
    message_id: str
    message_type: str
    seq: int | None
    reason: str
    body: bytes
    arrival: int = 0


@dataclass(frozen=True)
class Claim:
    """What ``Tx.claim`` read under the locks."""

    fresh: bool  # False: the inbox already had this message
    order: OrderView
    saga: SagaState | None
