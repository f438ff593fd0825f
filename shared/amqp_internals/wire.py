"""Faster AMQP frame encoding and decoding for the frames every message crosses.

pamqp, under aiormq, encodes and decodes each frame generically: per field it looks up the
field's type by name and dispatches on it. A message crosses a publish, a content header and
a body on the way out, and a deliver, a content header and a body on the way in; with the
publisher confirms and acks these are 10-13% of the coordinator's and adapters' samples under
load (py-spy). Here those frames are coded directly with ``struct``, and a ``headers`` table
of text values (all this system sets) too; other values, the other fields' types, every other
frame, and any frame this code cannot code, go to pamqp, so every error is pamqp's own, but
one: a value pamqp cannot decode though the broker passed it on (``UNREADABLE``). The bytes
out are pamqp's and a decoded frame equals pamqp's field for field: ``tests/unit/
test_wire.py`` checks both on generated frames, on frames built byte by byte with any value
the wire can carry, and on corrupted ones. Measured: a publish's three frames 9.7 -> 5.1 us, a
delivery's 12.1 -> 6.8 us; refunds at 256 in flight 505.5 -> 525.0 sagas/s (three
alternating rounds), coordinator 1.28 -> 1.20 and adapters 0.70 -> 0.64 ms of CPU a saga.

Installed by ``install()`` (``Bus.connect`` calls it) in place of the two functions aiormq
calls, ``pamqp.frame.marshal`` and ``pamqp.frame.unmarshal``. ``SAGA_FAST_FRAMES=0`` leaves
pamqp's own, but for a frame pamqp cannot decode (``guarded_unmarshal``)."""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from typing import Any

import pamqp.frame
from pamqp import decode, encode
from pamqp.body import ContentBody
from pamqp.commands import Basic
from pamqp.header import ContentHeader

ORIGINAL_MARSHAL = pamqp.frame.marshal
ORIGINAL_UNMARSHAL = pamqp.frame.unmarshal

_FRAME = struct.Struct(">BHI")  # type, channel, payload size
_END = b"\xce"
_METHOD, _HEADER, _BODY = 1, 2, 3
_CONTENT = struct.Struct(">HHQH")  # class, weight, body size, the first property flags
_PUBLISH = struct.pack(">IH", Basic.Publish.index, 0)  # method index, ticket 0
_ACK = struct.Struct(">IqB")  # method index, delivery tag (signed, as pamqp), multiple
_INDEX = struct.Struct(">I")
_TAG = struct.Struct(">q")

_LENGTH = struct.Struct(">I")
_KEY_MOST = 128  # bytes: pamqp cuts longer keys (with a warning); those tables go to pamqp
# A value pamqp cannot decode though RabbitMQ passed it on makes pamqp raise in aiormq's reader,
# which closes the connection: the message comes back on every reconnect, and its queue's consumer
# never gets past it. Three kinds: a table or array nested deeper than Python's recursion limit
# (RabbitMQ passes 2,000 levels on); a timestamp out of Python's range (the property, or a header's
# value at any depth: any 64 bits pass the broker); and a short string that is not UTF-8 (a property
# such as the message id, a header's name, a routing key: the broker checks none). Here such a
# header is skipped by its length and its value replaced by ``UNDECODED`` (a header whose name is
# not UTF-8 left out), such a property left out, and what it was and why put under ``UNREADABLE``,
# so the delivery arrives and ``saga_shared.transport.codec`` refuses it as invalid (dead letter,
# named), once. A routing key is read escaped instead (``_short_str``): a delivery has no headers of
# its own, and no binding of this system routes by such a key but the intake's and the partitions'
# ``saga.*``, whose gateway refuses a command whose key does not name its type.
UNREADABLE = "x-saga-unreadable"
UNDECODED = "(not decoded)"
_SIZES = {b"F": None, b"A": None, b"T": 8}  # a table and an array say their length first
_VALUE_ERRORS = (RecursionError, ValueError, OverflowError, OSError)
# datetime's own words for a year past 9999 (or before 1); pamqp's errors for a malformed value
# ("Unknown type", "Could not unpack ...") are ValueErrors too, and stay pamqp's to raise.
_OUT_OF_RANGE = re.compile(r"year -?\d+ is out of range")


def _unreadable(error: BaseException) -> bool:
    """Whether pamqp failed on a value the broker passes on (nesting past the recursion limit,
    a timestamp past datetime's range: OverflowError or OSError on some platforms; a table's
    key that is not UTF-8), not on a malformed one, which no broker delivers and which pamqp
    refuses as before."""
    if isinstance(error, RecursionError | OverflowError | OSError | UnicodeDecodeError):
        return True
    return isinstance(error, ValueError) and _OUT_OF_RANGE.fullmatch(str(error)) is not None


def _why(what: str, error: BaseException) -> str:
    if isinstance(error, RecursionError):
        reason = "nested too deeply to decode"
    elif isinstance(error, UnicodeDecodeError):
        reason = f"not UTF-8 (byte 0x{error.object[error.start]:02x} at {error.start})"
    else:
        reason = str(error)
    return f"{what}: {reason}"


def _short_str(data: bytes) -> tuple[int, str]:
    """``pamqp.decode.short_str``; a name a publisher chose (a routing key) that is not UTF-8 is
    read with its bytes escaped (``saga.\\xff``) instead of failing the frame: it is text to
    compare, store and show, and matches no name of this system."""
    try:
        return decode.short_str(data)
    except UnicodeDecodeError:
        return 1 + data[0], data[1 : 1 + data[0]].decode("utf-8", "backslashreplace")


def _table(value: Any) -> bytes:
    """``pamqp.encode.field_table`` for a table of text values (every header this system
    sets); any other goes to pamqp."""
    if not value or type(value) is not dict:
        return encode.field_table(value)
    parts: list[bytes] = []
    for key, item in sorted(value.items()):
        if type(key) is not str or type(item) is not str:
            return encode.field_table(value)
        name, text = key.encode("utf-8"), item.encode("utf-8")
        if len(name) > _KEY_MOST:
            return encode.field_table(value)
        parts += (bytes((len(name),)), name, b"S", _LENGTH.pack(len(text)), text)
    data = b"".join(parts)
    return _LENGTH.pack(len(data)) + data


def _read_table(data: bytes) -> tuple[int, dict[str, Any]]:
    """``pamqp.decode.field_table``: text values here, any other through pamqp's own (but one
    it cannot decode: see ``UNREADABLE``)."""
    (length,) = _LENGTH.unpack_from(data)
    end = 4 + length
    if end > len(data):
        raise ValueError("field table longer than its frame")
    table: dict[str, Any] = {}
    why = None  # the first value not decoded: said last, over any such header a sender set
    offset = 4
    while offset < end:
        size = data[offset]
        if offset + 1 + size > end:
            raise ValueError("field table key longer than the table")
        try:
            key: str | None = data[offset + 1 : offset + 1 + size].decode("utf-8")
        except UnicodeDecodeError as error:  # the broker passes it on; its header is left out
            key, why = None, why or _why("a header's name", error)
        offset += 1 + size
        value: Any
        if data[offset : offset + 1] == b"S":
            (size,) = _LENGTH.unpack_from(data, offset + 1)
            raw = data[offset + 5 : offset + 5 + size]
            try:
                value = raw.decode("utf-8")
            except UnicodeDecodeError:
                value = raw  # as pamqp: text that is not UTF-8 stays bytes
            used = 5 + size
        else:
            try:
                used, value = decode.embedded_value(data[offset:])
            except _VALUE_ERRORS as error:
                if not _unreadable(error):
                    raise
                used, value = _skipped(data, offset, end, error), UNDECODED
                why = why or _why(f"header {key!r}", error)
        if key is not None:
            table[key] = value
        offset += used
    if why is not None:
        table[UNREADABLE] = why
    return end, table


def _skipped(data: bytes, offset: int, end: int, error: BaseException) -> int:
    """The length of a value pamqp could not decode, found without decoding it; the error again
    when it has none (then the frame itself is malformed: pamqp decodes it and raises)."""
    if data[offset : offset + 1] not in _SIZES:
        raise error
    size = _SIZES[data[offset : offset + 1]]
    used = 1 + size if size is not None else 5 + _LENGTH.unpack_from(data, offset + 1)[0]
    if offset + used > end:
        raise error
    return used


_Encoder = Callable[[Any], bytes]
_Decoder = Callable[[bytes], tuple[int, Any]]
_CODERS: dict[str, tuple[_Encoder, _Decoder]] = {
    "shortstr": (encode.short_string, decode.short_str),
    "table": (_table, _read_table),
    "octet": (encode.octet, decode.octet),
    "timestamp": (encode.timestamp, decode.timestamp),
}
# Basic.Properties's fields in wire order: name, flag bit, encoder, decoder.
_PROPERTIES = [
    (name, Basic.Properties.flags[name], *_CODERS[getattr(Basic.Properties, "_" + name)])
    for name in Basic.Properties.__slots__
]
_DEFAULTS = dict.fromkeys(Basic.Properties.__slots__) | {"cluster_id": ""}


def _properties(properties: Basic.Properties) -> bytes:
    flags, parts = 0, []
    for name, flag, encoder, _ in _PROPERTIES:
        value = getattr(properties, name)
        if value is not None and value != "":
            flags |= flag
            parts.append(encoder(value))
    return struct.pack(">H", flags) + b"".join(parts)


def _payload(frame: object) -> tuple[int, bytes] | None:
    kind = type(frame)
    if kind is ContentBody:
        return _BODY, frame.value  # type: ignore[attr-defined]
    if kind is ContentHeader:
        header: ContentHeader = frame  # type: ignore[assignment]
        size = struct.pack(">HxxQ", Basic.frame_id, header.body_size)
        return _HEADER, size + _properties(header.properties)
    if kind is Basic.Publish and frame.ticket == 0:  # type: ignore[attr-defined]
        publish: Basic.Publish = frame  # type: ignore[assignment]
        publish.validate()  # as pamqp does before it encodes
        bits = struct.pack("B", publish.mandatory | publish.immediate << 1)
        return _METHOD, (_PUBLISH + encode.short_string(publish.exchange)
                         + encode.short_string(publish.routing_key) + bits)  # fmt: skip
    if kind is Basic.Ack:
        ack: Basic.Ack = frame  # type: ignore[assignment]
        return _METHOD, _ACK.pack(Basic.Ack.index, ack.delivery_tag, ack.multiple)
    return None


def marshal(frame: Any, channel_id: int) -> bytes:
    """``pamqp.frame.marshal``, the same bytes; what this does not know, or cannot encode,
    pamqp encodes (and raises about) as before."""
    try:
        coded = _payload(frame)
    except Exception:  # pamqp encodes it again, and raises its own error
        coded = None
    if coded is None:
        return ORIGINAL_MARSHAL(frame, channel_id)
    kind, payload = coded
    return b"".join((_FRAME.pack(kind, channel_id, len(payload)), payload, _END))


def _content_header(payload: bytes) -> ContentHeader:
    class_id, weight, body_size, flags = _CONTENT.unpack_from(payload)
    if flags & 1:
        raise ValueError("a second word of property flags")  # pamqp decodes it
    values = dict(_DEFAULTS)
    offset = _CONTENT.size
    why = None  # said last: over the headers table, which comes after two properties
    for name, flag, _, decoder in _PROPERTIES:
        if flags & flag:
            try:
                used, values[name] = decoder(payload[offset:])
            except _VALUE_ERRORS as error:
                used, values[name] = _property_skipped(name, payload, offset, error), None
                why = why or _why(f"property {name!r}", error)
            offset += used
    if why is not None:
        values["headers"] = {**(values["headers"] or {}), UNREADABLE: why}
    properties = Basic.Properties.__new__(Basic.Properties)
    for name, value in values.items():
        setattr(properties, name, value)
    header = ContentHeader.__new__(ContentHeader)
    header.class_id, header.weight, header.body_size = class_id, weight, body_size
    header.properties = properties
    return header


def _property_skipped(name: str, payload: bytes, offset: int, error: BaseException) -> int:
    """The length of a property the broker passed on and pamqp cannot decode (a timestamp out
    of range, a short string that is not UTF-8), to leave it out; the error again otherwise."""
    if name == "timestamp" and len(payload) >= offset + 8 and _unreadable(error):
        return 8
    if isinstance(error, UnicodeDecodeError) and offset + 1 + payload[offset] <= len(payload):
        return 1 + payload[offset]  # a short string: its length, then its bytes
    raise error


def _deliver(payload: bytes) -> Basic.Deliver:
    used, consumer_tag = _short_str(payload[4:])
    offset = 4 + used
    (delivery_tag,) = _TAG.unpack_from(payload, offset)
    redelivered = bool(payload[offset + 8] & 1)
    used, exchange = _short_str(payload[offset + 9 :])
    offset += 9 + used
    _, routing_key = _short_str(payload[offset:])
    deliver = Basic.Deliver.__new__(Basic.Deliver)
    deliver.consumer_tag, deliver.delivery_tag = consumer_tag, delivery_tag
    deliver.redelivered, deliver.exchange, deliver.routing_key = (
        redelivered, exchange, routing_key,
    )  # fmt: skip
    return deliver


def _ack(payload: bytes) -> Basic.Ack:
    _, delivery_tag, bits = _ACK.unpack_from(payload)
    ack = Basic.Ack.__new__(Basic.Ack)
    ack.delivery_tag, ack.multiple = delivery_tag, bool(bits & 1)
    return ack


_METHODS = {Basic.Deliver.index: _deliver, Basic.Ack.index: _ack}


def _decoded(data: bytes) -> tuple[int, int, Any] | None:
    kind, channel, size = _FRAME.unpack_from(data)
    end = _FRAME.size + size
    if size == 0 or len(data) < end + 1 or data[end] != 0xCE:
        return None
    payload = data[_FRAME.size : end]
    if kind == _BODY:
        return end + 1, channel, ContentBody(payload)
    if kind == _HEADER:
        return end + 1, channel, _content_header(payload)
    if kind == _METHOD:
        method = _METHODS.get(_INDEX.unpack_from(payload)[0])
        if method is not None:
            return end + 1, channel, method(payload)
    return None


def _here(data: bytes) -> tuple[int, int, Any] | None:
    """The frame decoded here; None when this does not know it or cannot decode it."""
    if data[:4] == b"AMQP":
        return None
    try:
        return _decoded(data)
    except Exception:  # pamqp decodes it, and raises its own error
        return None


def unmarshal(data: bytes) -> tuple[int, int, Any]:
    """``pamqp.frame.unmarshal``, an equal frame; what this does not know, or cannot decode,
    pamqp decodes (and raises about) as before."""
    return _here(data) or ORIGINAL_UNMARSHAL(data)


def guarded_unmarshal(data: bytes) -> tuple[int, int, Any]:
    """``pamqp.frame.unmarshal`` itself, but a frame it cannot decode though the broker passed
    it on (``UNREADABLE``) is decoded here instead of closing the connection: the speed is
    what ``SAGA_FAST_FRAMES=0`` gives up, not the protection."""
    try:
        return ORIGINAL_UNMARSHAL(data)
    except Exception:
        decoded = _here(data)
        if decoded is None:
            raise  # pamqp's error, for a frame neither can decode
        return decoded


def install(enabled: bool) -> None:
    """In place of pamqp's two functions for the whole process (each ``Bus.connect`` calls it;
    calling it again changes nothing); ``enabled=False`` puts pamqp's own coding back, with
    ``guarded_unmarshal`` around its decoding."""
    pamqp.frame.marshal = marshal if enabled else ORIGINAL_MARSHAL  # type: ignore[assignment]
    pamqp.frame.unmarshal = unmarshal if enabled else guarded_unmarshal  # type: ignore[assignment]
