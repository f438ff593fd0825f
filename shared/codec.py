"""The one module that converts messages to and from AMQP."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, TypeVar

import aio_pika
from aio_pika.abc import AbstractIncomingMessage
from pydantic import TypeAdapter, ValidationError

from shared.errors import InvalidMessage
from shared.messages import Command, Envelope, PartitionMessage

T = TypeVar("T")

COMMANDS: TypeAdapter[Command] = TypeAdapter(Command)
PARTITION: TypeAdapter[PartitionMessage] = TypeAdapter(PartitionMessage)
CONTENT_TYPE = "application/json"


def encode(message: Envelope) -> bytes:
    return message.model_dump_json().encode()


def to_amqp(
    body: bytes,
    *,
    message_id: str,
    message_type: str,
    order_id: str,
    headers: dict[str, Any] | None = None,
) -> aio_pika.Message:
    """Build the AMQP message from an encoded body (the outbox stores bodies, not models)."""
    return aio_pika.Message(
        body,
        content_type=CONTENT_TYPE,
        message_id=message_id,
        type=message_type,
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        headers={"x-order-id": order_id, **(headers or {})},
    )


def message_to_amqp(message: Envelope) -> aio_pika.Message:
    return to_amqp(
        encode(message),
        message_id=message.message_id,
        message_type=message.type,
        order_id=message.order_id,
    )


def decode(body: bytes, adapter: TypeAdapter[T], *, max_bytes: int) -> T:
    """Parse and validate a body; every failure is an ``InvalidMessage`` naming what is wrong."""
    if len(body) > max_bytes:
        raise InvalidMessage(f"body of {len(body)} bytes is over the limit of {max_bytes}")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidMessage(f"body is not valid UTF-8 (byte {exc.start})") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidMessage(f"body is not JSON: {exc.msg} at line {exc.lineno}") from None
    if not isinstance(raw, dict):
        raise InvalidMessage("body must be a JSON object")
    try:
        return adapter.validate_python(raw)
    except ValidationError as exc:
        raise InvalidMessage(describe(exc, tag=raw.get("type"))) from None


def decode_incoming(message: AbstractIncomingMessage, adapter: TypeAdapter[T], max_bytes: int) -> T:
    return decode(message.body, adapter, max_bytes=max_bytes)


def describe(exc: ValidationError, tag: object = None) -> str:
    """One line per problem, each naming the field: ``params.quantity: Input should be ...``."""
    parts = []
    for err in exc.errors(include_url=False):
        path = list(err["loc"])
        if path and path[0] == tag:  # a discriminated union puts the type tag first
            path = path[1:]
        loc = ".".join(str(p) for p in path) or "message"
        parts.append(f"{loc}: {err['msg']}")
    return "; ".join(parts)


def peek(body: bytes) -> dict[str, str | None]:
    """Best-effort identifiers of a body that may be invalid, to name it in errors and replies."""
    keys = ("message_id", "type", "saga_id", "order_id", "reply_to")
    try:
        raw = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raw = None
    if not isinstance(raw, dict):
        return dict.fromkeys(keys)
    return {
        k: v if isinstance(v, str) and len(v) <= 255 else None for k in keys for v in [raw.get(k)]
    }


@dataclass(frozen=True)
class Identity:
    """What a possibly broken message is: enough to name it, block its order and replay it."""

    message_id: str
    order_id: str | None
    saga_id: str | None
    message_type: str | None


def identify(body: bytes, message_id: str | None, headers: dict[str, Any]) -> Identity:
    """The body's own id first (the one the coordinator applies, and unblocks by), then the AMQP
    property; a message with no id at all is named by a hash of its body, so every component
    names the same broken message the same way."""
    seen = peek(body)
    header_order = headers.get("x-order-id")
    order_id = header_order if isinstance(header_order, str) else seen["order_id"]
    mid = seen["message_id"] or message_id or f"body:{hashlib.sha256(body).hexdigest()[:24]}"
    return Identity(mid, order_id, seen["saga_id"], seen["type"])


def identify_incoming(message: AbstractIncomingMessage) -> Identity:
    return identify(message.body, message.message_id, dict(message.headers or {}))
