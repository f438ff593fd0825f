"""The one module that converts messages to and from AMQP.

Every body is checked before any model sees it: size, UTF-8, JSON without NaN or Infinity, then
its shape (nesting depth, number of values, integer range, finite floats, and no character that
Postgres or a terminal cannot take). Whatever goes wrong, ``decode`` raises ``InvalidMessage``
naming what is wrong; it never lets another exception out.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from typing import Any, TypeVar

import pamqp.commands
from aio_pika.abc import AbstractIncomingMessage
from pydantic import TypeAdapter, ValidationError

from saga_shared.amqp_internals import wire
from saga_shared.errors import InvalidMessage
from saga_shared.model.messages import Command, Outbound, PartitionMessage
from saga_shared.model.text import clean, first_unsafe, header_text

T = TypeVar("T")

COMMANDS: TypeAdapter[Command] = TypeAdapter(Command)
PARTITION: TypeAdapter[PartitionMessage] = TypeAdapter(PartitionMessage)
CONTENT_TYPE = "application/json"
PERSISTENT = 2  # AMQP delivery mode: the broker writes the message to disk
TRANSIENT = 1
# Kept by the register and sent again by its deadline: nothing is lost with the broker's copy
# (saga_shared.transport.topology, request queues).
TRANSIENT_TYPES = frozenset({"action.request"})

# The shape any body must keep to. Real messages are a few levels deep and a few dozen values;
# these bounds leave room and stop a hostile body long before it costs anything.
MAX_DEPTH = 32
MAX_VALUES = 10_000
INT_BOUND = 2**63  # integers must fit a signed 64-bit column
# peek() reads ids out of bodies already refused, so it must not be the costly part: a body
# larger than this is named by its hash.
PEEK_BYTES = 1024 * 1024

ID_PATTERN = re.compile(r"^[A-Za-z0-9_.:@-]{1,128}$")
TYPE_PATTERN = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z0-9_]+){1,3}$")
# A queue the broker named for a client (amq.gen-...) or one a client named itself.
QUEUE_PATTERN = re.compile(r"^[A-Za-z0-9_.:@-]{1,255}$")


def encode(message: Outbound) -> bytes:
    return message.model_dump_json().encode()


class Outgoing:
    """A message ready to publish: its body and its AMQP properties, built at once. aio-pika's
    ``Message`` builds the same properties through a hook on every attribute and again on every
    read (about 8% of an adapter's CPU under load, py-spy); this is what ``Bus`` publishes. Its
    properties belong to it: ``Bus`` stamps the publishing user on them."""

    __slots__ = ("body", "properties")

    def __init__(self, body: bytes, properties: pamqp.commands.Basic.Properties) -> None:
        self.body = body
        self.properties = properties

    def __repr__(self) -> str:
        p = self.properties
        return f"Outgoing({p.message_type} {p.message_id}, {len(self.body)} bytes)"


def to_amqp(
    body: bytes,
    *,
    message_id: str,
    message_type: str,
    order_id: str,
    headers: dict[str, Any] | None = None,
) -> Outgoing:
    """Build the AMQP message from an encoded body (the outbox stores bodies, not models)."""
    return Outgoing(
        body,
        pamqp.commands.Basic.Properties(
            content_type=CONTENT_TYPE,
            delivery_mode=TRANSIENT if message_type in TRANSIENT_TYPES else PERSISTENT,
            message_id=message_id,
            message_type=message_type,
            headers={"x-order-id": order_id, **(headers or {})},
        ),
    )


def copy_of(message: AbstractIncomingMessage, headers: dict[str, Any]) -> Outgoing:
    """A delivered message to publish again, persistent (buried, moved to a quorum queue): its
    properties as they came (the publishing bus stamps its own user), ``headers`` added."""
    properties = pamqp.commands.Basic.Properties(
        content_type=message.content_type, content_encoding=message.content_encoding,
        headers={**(message.headers or {}), **headers}, delivery_mode=PERSISTENT,
        correlation_id=message.correlation_id, reply_to=message.reply_to,
        message_id=message.message_id,
        timestamp=message.timestamp, message_type=message.type, app_id=message.app_id,
    )  # fmt: skip
    return Outgoing(message.body, properties)


def message_to_amqp(message: Outbound, headers: dict[str, Any] | None = None) -> Outgoing:
    return to_amqp(
        encode(message),
        message_id=message.message_id,
        message_type=message.type,
        order_id=getattr(message, "order_id", None) or "",
        headers=headers,
    )


def _no_constant(name: str) -> Any:
    raise InvalidMessage(f"body is not JSON: {name} is not a number JSON allows")


def parse(body: bytes, *, max_bytes: int) -> dict[str, Any]:
    """The body as a JSON object whose shape ``check_shape`` accepts."""
    if len(body) > max_bytes:
        raise InvalidMessage(f"body of {len(body)} bytes is over the limit of {max_bytes}")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidMessage(f"body is not valid UTF-8 (byte {exc.start})") from None
    try:
        raw = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise InvalidMessage(f"body is not JSON: {exc.msg} at line {exc.lineno}") from None
    except RecursionError:
        raise InvalidMessage(f"body is nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # an integer of more digits than Python converts
        raise InvalidMessage(f"body is not acceptable JSON: {clean(str(exc), 200)}") from None
    if not isinstance(raw, dict):
        raise InvalidMessage("body must be a JSON object")
    check_shape(raw)
    return raw


def check_shape(value: Any) -> None:
    """Depth, size, integer range, finite floats and safe characters (keys included), walked
    without recursion so that no body can exhaust the stack. The first walk builds no paths
    (the path of every value of every message was half the cost of checking it); only when it
    finds something wrong does a second walk, the same rules, name where."""
    try:
        _walk(value, named=False)
        return
    except InvalidMessage:
        pass
    _walk(value, named=True)
    raise InvalidMessage("body: not an acceptable shape")  # not reached: the same rules


def _walk(value: Any, *, named: bool) -> None:
    pending: list[tuple[Any, int, str]] = [(value, 1, "")]
    seen = 0
    while pending:
        item, depth, path = pending.pop()
        seen += 1
        if seen > MAX_VALUES:
            raise InvalidMessage(f"body holds more than {MAX_VALUES} values")
        if depth > MAX_DEPTH:
            raise InvalidMessage(f"{path or 'body'}: nested deeper than {MAX_DEPTH} levels")
        if isinstance(item, str):
            _check_text(item, path)
        elif isinstance(item, bool) or item is None:
            continue
        elif isinstance(item, int):
            if not -INT_BOUND <= item < INT_BOUND:
                raise InvalidMessage(f"{path or 'body'}: integer outside the 64-bit range")
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise InvalidMessage(f"{path or 'body'}: number too large")
        elif isinstance(item, dict):
            for key, child in item.items():
                _check_text(key, f"{path or 'body'}: a key" if named else "")
                where = clean(f"{path}.{key}" if path else key, 120) if named else ""
                pending.append((child, depth + 1, where))
        elif isinstance(item, list):
            if named:
                pending.extend((c, depth + 1, f"{path}[{i}]") for i, c in enumerate(item))
            else:
                pending.extend((c, depth + 1, "") for c in item)


def _check_text(text: str, path: str) -> None:
    problem = first_unsafe(text)
    if problem is not None:
        raise InvalidMessage(f"{path or 'body'}: {problem} is not allowed")


def decode(
    body: bytes,
    adapter: TypeAdapter[T],
    *,
    max_bytes: int,
    defaults: dict[str, str] | None = None,
) -> T:
    """Parse and validate a body; every failure is an ``InvalidMessage`` naming what is wrong.
    ``defaults``: top-level fields a body may leave out (the AMQP message-id, for one)."""
    raw = parse(body, max_bytes=max_bytes)
    for key, value in (defaults or {}).items():
        raw.setdefault(key, value)
    try:
        return adapter.validate_python(raw)
    except ValidationError as exc:
        raise InvalidMessage(describe(exc, tag=raw.get("type"))) from None


def decode_incoming(message: AbstractIncomingMessage, adapter: TypeAdapter[T], max_bytes: int) -> T:
    """A delivery's body; one without an id of its own takes the AMQP message-id (a message
    re-sent under the same property is then a duplicate the inbox absorbs)."""
    unreadable = (message.headers or {}).get(wire.UNREADABLE)
    if unreadable is not None:
        # what, and why (``saga_shared.amqp_internals.wire``)
        raise InvalidMessage(clean(str(unreadable), 200))
    transport = well_formed_id(message.message_id)
    defaults = {"message_id": transport} if transport else None
    return decode(message.body, adapter, max_bytes=max_bytes, defaults=defaults)


def order_header(message: AbstractIncomingMessage) -> str | None:
    """The order a delivery's ``x-order-id`` header names, None when it names none. A
    partition's consumer keys its deliveries by it (two of one order are never in hand at
    once), before the body is read; ``check_order_header`` holds it to the body."""
    return header_text((message.headers or {}).get("x-order-id")) or None


def check_order_header(message: AbstractIncomingMessage, order_id: str | None) -> None:
    """A header naming another order than the body would let two deliveries of one order be
    in hand at once, so one could overtake the other's failure: it is refused."""
    named = order_header(message)
    if named is not None and order_id is not None and named != order_id:
        raise InvalidMessage(
            f"header x-order-id '{named[:80]}' names another order than the body's "
            f"order_id '{order_id}'"
        )


def describe(exc: ValidationError, tag: object = None) -> str:
    """One line per problem, each naming the field: ``params.quantity: Input should be ...``.
    Field names may be a sender's invention: they are cleaned before they are shown."""
    parts = []
    for err in exc.errors(include_url=False, include_input=False):
        path = list(err["loc"])
        if path and path[0] == tag:  # a discriminated union puts the type tag first
            path = path[1:]
        loc = ".".join(str(p) for p in path) or "message"
        parts.append(f"{clean(loc, 120)}: {clean(err['msg'], 300)}")
        if len(parts) == 10:
            parts.append(f"and {exc.error_count() - 10} more")
            break
    return "; ".join(parts)


def peek(body: bytes) -> dict[str, str | None]:
    """Best-effort identifiers of a body that may be invalid, to name it in errors and replies:
    only values that are well-formed identifiers, so whatever is built from them cannot fail."""
    patterns = {
        "message_id": ID_PATTERN,
        "type": TYPE_PATTERN,
        "saga_id": ID_PATTERN,
        "order_id": ID_PATTERN,
        "reply_to": QUEUE_PATTERN,
    }
    raw: Any = None
    if len(body) <= PEEK_BYTES:
        try:
            raw = json.loads(body)
        except (ValueError, UnicodeDecodeError, RecursionError):
            raw = None
    if not isinstance(raw, dict):
        return dict.fromkeys(patterns)
    found: dict[str, str | None] = {}
    for key, pattern in patterns.items():
        value = raw.get(key)
        found[key] = value if isinstance(value, str) and pattern.match(value) else None
    return found


def well_formed_id(value: object) -> str | None:
    return value if isinstance(value, str) and ID_PATTERN.match(value) else None


@dataclass(frozen=True)
class Identity:
    """What a possibly broken message is: enough to name it, block its order and replay it."""

    message_id: str
    order_id: str | None
    saga_id: str | None
    message_type: str | None
    transport_id: str | None = None  # the AMQP message-id property, when well formed


def identify(body: bytes, message_id: str | None, headers: dict[str, Any]) -> Identity:
    """The body's own id first (the one the coordinator applies, and unblocks by), then the AMQP
    property; a message with no id at all is named by a hash of its body, so every component
    names the same broken message the same way. The order comes from the body (a header is only
    a hint, and anyone can set one)."""
    seen = peek(body)
    transport = well_formed_id(message_id)
    order_id = seen["order_id"] or well_formed_id(headers.get("x-order-id"))
    mid = seen["message_id"] or transport or f"body:{hashlib.sha256(body).hexdigest()[:24]}"
    return Identity(mid, order_id, seen["saga_id"], seen["type"], transport)


def identify_incoming(message: AbstractIncomingMessage) -> Identity:
    return identify(message.body, message.message_id, dict(message.headers or {}))
