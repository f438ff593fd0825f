"""``saga_shared.amqp_internals.wire`` codes frames as pamqp does: the same bytes out, equal frames
in, and for
anything malformed pamqp's own error; but a value pamqp cannot decode in a frame otherwise
whole (a timestamp out of range, a table nested too deeply) arrives marked instead of closing
the connection. Checked on generated frames and on corrupted ones."""

from __future__ import annotations

import contextlib
import datetime
import decimal
import re
import sys
from collections.abc import Callable
from typing import Any

import pamqp.decode
import pamqp.frame
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands as spec
from pamqp import encode
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from saga_shared.amqp_internals import wire

names = st.text(max_size=60)  # up to 240 bytes of UTF-8: a short string holds 255
exchanges = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_.:", max_size=40)
values = st.recursive(
    st.one_of(
        st.text(max_size=40), st.integers(-(2**63), 2**63 - 1), st.booleans(), st.none(),
        st.binary(max_size=8).map(lambda b: b.decode("latin-1")),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=6,
)  # fmt: skip
text_headers = st.dictionaries(st.text(max_size=140), st.text(max_size=60), max_size=4)
headers = st.one_of(text_headers, st.dictionaries(st.text(max_size=20), values, max_size=4))
moments = st.datetimes(
    min_value=datetime.datetime(1971, 1, 1), max_value=datetime.datetime(2100, 1, 1)
).map(lambda d: d.replace(microsecond=0, tzinfo=datetime.UTC))


def maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), strategy)


properties = st.builds(
    spec.Basic.Properties,
    content_type=maybe(names), content_encoding=maybe(names), headers=maybe(headers),
    delivery_mode=maybe(st.sampled_from([1, 2])), priority=maybe(st.integers(0, 255)),
    correlation_id=maybe(names), reply_to=maybe(names), expiration=maybe(names),
    message_id=maybe(names), timestamp=maybe(moments), message_type=maybe(names),
    user_id=maybe(names), app_id=maybe(names),
)  # fmt: skip
frames = st.one_of(
    st.builds(spec.Basic.Publish, exchange=exchanges, routing_key=names,
              mandatory=st.booleans(), immediate=st.booleans()),
    st.builds(ContentHeader, weight=st.just(0), body_size=st.integers(0, 2**40),
              properties=properties),
    st.builds(ContentBody, st.binary(min_size=1, max_size=300)),  # pamqp refuses an empty one
    st.builds(spec.Basic.Ack, delivery_tag=st.integers(0, 2**63 - 1), multiple=st.booleans()),
    st.builds(spec.Basic.Deliver, consumer_tag=names, delivery_tag=st.integers(0, 2**63 - 1),
              redelivered=st.booleans(), exchange=exchanges, routing_key=names),
    st.builds(spec.Basic.Nack, delivery_tag=st.integers(0, 2**40), multiple=st.booleans()),
    st.builds(spec.Channel.Close, reply_code=st.integers(200, 599), reply_text=names,
              class_id=st.integers(0, 90), method_id=st.integers(0, 90)),
)  # fmt: skip
channels = st.integers(0, 2**16 - 1)


def fields(frame: Any) -> dict[str, Any]:
    """A frame as its values, nested properties included, to compare two decodings."""
    if isinstance(frame, ContentHeader):
        props = {k: getattr(frame.properties, k) for k in spec.Basic.Properties.__slots__}
        return {"class_id": frame.class_id, "weight": frame.weight,
                "body_size": frame.body_size, "properties": props}  # fmt: skip
    if isinstance(frame, ContentBody):
        return {"value": frame.value}
    return {k: getattr(frame, k) for k in frame.__slots__}


def outcome(function: Any, *args: Any) -> tuple[str, Any]:
    try:
        result = function(*args)
    except Exception as exc:  # the error's type is what is compared
        return "raised", type(exc)
    if isinstance(result, bytes):
        return "bytes", result
    used, channel, frame = result
    return "frame", (used, channel, type(frame), fields(frame))


def _lenient_timestamp(value: bytes) -> tuple[int, Any]:
    try:
        return ORIGINAL_TIMESTAMP(value)
    except (ValueError, OverflowError, OSError):
        if len(value) < 8:
            raise
        return 8, None


def _lenient_short_str(escaped: bool) -> Callable[[bytes], tuple[int, Any]]:
    def short_str(value: bytes) -> tuple[int, Any]:
        try:
            return ORIGINAL_SHORT_STR(value)
        except UnicodeDecodeError:
            raw = value[1 : 1 + value[0]]
            return 1 + value[0], raw.decode("utf-8", "backslashreplace") if escaped else None

    return short_str


def _lenient_table(value: bytes) -> tuple[int, dict[str, Any]]:
    """pamqp's ``field_table``, an entry whose name is not UTF-8 left out."""
    length = int.from_bytes(value[0:4], "big")
    if len(value) < 4 or 4 + length > len(value):
        return ORIGINAL_TABLE(value)  # pamqp's error
    offset, table = 4, {}
    while offset < 4 + length:
        size = value[offset]
        if offset + 1 + size > 4 + length:
            return ORIGINAL_TABLE(value)
        name = value[offset + 1 : offset + 1 + size]
        offset += 1 + size
        used, item = pamqp.decode.embedded_value(value[offset:])
        offset += used
        with contextlib.suppress(UnicodeDecodeError):
            table[name.decode("utf-8")] = item
    return 4 + length, table


ORIGINAL_TIMESTAMP = pamqp.decode.timestamp
ORIGINAL_SHORT_STR = pamqp.decode.short_str
ORIGINAL_TABLE = pamqp.decode.field_table


def lenient(data: bytes, escaped: bool) -> tuple[str, Any]:
    """pamqp's decoding where what a broker passes on is read instead of raising: a timestamp
    out of range as None, a short string not UTF-8 escaped (``escaped``) or as None, a table
    entry whose name is not UTF-8 left out."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(pamqp.decode.METHODS, "timestamp", _lenient_timestamp)
        patch.setitem(pamqp.decode.TABLE_MAPPING, b"T", _lenient_timestamp)
        patch.setitem(pamqp.decode.METHODS, "shortstr", _lenient_short_str(escaped))
        patch.setitem(pamqp.decode.METHODS, "table", _lenient_table)
        patch.setitem(pamqp.decode.TABLE_MAPPING, b"F", _lenient_table)
        return outcome(wire.ORIGINAL_UNMARSHAL, data)


MARKED = re.compile(r"year -?\d+ is out of range|not UTF-8 \(byte|nested too deeply")


def as_pamqp(data: bytes) -> None:
    """``wire.unmarshal`` decodes ``data`` as pamqp does; or, where pamqp fails on what a broker
    passes on, a delivery's names escaped as a lenient pamqp reads them, and a content header
    marked (so that its message is refused) with every other property a lenient pamqp's.
    (A header skipped whole is not decoded further: when a corruption put a malformed value
    beside what was skipped for, pamqp fails even when lenient, and the frame arrives marked
    all the same. No broker delivers such a frame.)"""
    ours, theirs = outcome(wire.unmarshal, data), outcome(wire.ORIGINAL_UNMARSHAL, data)
    if ours == theirs:
        return
    assert theirs[0] == "raised" and ours[0] == "frame", (ours, theirs)
    if ours[1][2] is not ContentHeader:
        assert ours == lenient(data, escaped=True), (ours, theirs)
        return
    mine = ours[1][3]["properties"]
    assert MARKED.search(mine["headers"][wire.UNREADABLE]), (ours, theirs)
    kind, lenient_frame = lenient(data, escaped=False)
    if kind != "frame":
        return
    its = lenient_frame[3]["properties"]
    assert ours[1][:3] == lenient_frame[:3]
    for name in spec.Basic.Properties.__slots__:
        if name != "headers":
            assert mine[name] == its[name], name


@settings(max_examples=400, deadline=None)
@given(frames, channels)
def test_the_same_bytes_as_pamqp(frame: Any, channel: int) -> None:
    assert wire.marshal(frame, channel) == wire.ORIGINAL_MARSHAL(frame, channel)


@settings(max_examples=400, deadline=None)
@given(frames, channels, st.binary(max_size=4))
def test_equal_frames_to_pamqps(frame: Any, channel: int, after: bytes) -> None:
    data = wire.ORIGINAL_MARSHAL(frame, channel) + after  # a read may hold the next frame
    assert outcome(wire.unmarshal, data) == outcome(wire.ORIGINAL_UNMARSHAL, data)
    assert outcome(wire.unmarshal, data)[0] == "frame"


@settings(max_examples=600, deadline=None)
@given(frames, channels, st.data())
def test_a_corrupted_frame_decodes_or_fails_as_with_pamqp(
    frame: Any, channel: int, data: st.DataObject
) -> None:
    raw = bytearray(wire.ORIGINAL_MARSHAL(frame, channel))
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(raw) - 1))
        raw[at] = data.draw(st.integers(0, 255))
    cut = bytes(raw[: data.draw(st.integers(0, len(raw)))])
    for sample in (bytes(raw), cut):
        as_pamqp(sample)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64))
def test_any_bytes_decode_or_fail_as_with_pamqp(data: bytes) -> None:
    as_pamqp(data)


@pytest.mark.parametrize(
    "frame",
    [
        spec.Basic.Ack(delivery_tag=1, multiple=False),
        ContentHeader(0, 3, spec.Basic.Properties(headers={"x-order-id": "o-1"})),
    ],
)
def test_a_frame_pamqp_refuses_to_encode_is_refused_alike(frame: Any) -> None:
    if isinstance(frame, ContentHeader):
        frame.properties.headers = {"k": object()}  # type: ignore[dict-item]  # no AMQP type
    else:
        frame.delivery_tag = 2**64  # over a long long
    with pytest.raises(TypeError):
        wire.ORIGINAL_MARSHAL(frame, 1)
    with pytest.raises(TypeError):
        wire.marshal(frame, 1)


def test_install_puts_it_in_pamqps_place_and_back() -> None:
    try:
        wire.install(True)
        assert pamqp.frame.marshal is wire.marshal
        assert pamqp.frame.unmarshal is wire.unmarshal
    finally:
        wire.install(False)
    assert pamqp.frame.marshal is wire.ORIGINAL_MARSHAL
    assert pamqp.frame.unmarshal is wire.guarded_unmarshal
    wire.install(True)  # as every bus of the default settings leaves it


def test_with_the_fast_frames_off_pamqp_decodes_and_raises_as_itself() -> None:
    """``guarded_unmarshal`` returns pamqp's own frame objects, and pamqp's error for a frame
    neither decoder can read."""
    frame = spec.Basic.Deliver("ctag", 7, False, "ex", "rk")
    raw = wire.ORIGINAL_MARSHAL(frame, 1)
    used, channel, decoded = wire.guarded_unmarshal(raw)
    assert (used, channel, type(decoded)) == (len(raw), 1, spec.Basic.Deliver)
    assert vars(decoded) == vars(wire.ORIGINAL_UNMARSHAL(raw)[2])
    broken = raw[:-1] + b"\x00"  # no frame end
    assert outcome(wire.guarded_unmarshal, broken) == outcome(wire.ORIGINAL_UNMARSHAL, broken)
    assert outcome(wire.guarded_unmarshal, broken)[0] == "raised"


# Frames built byte by byte, so that every field takes any value the wire can carry: tags
# over 2**63, bit bytes with other bits set, text that is not UTF-8, tables whose lengths lie.
def short(raw: bytes) -> bytes:
    return bytes((len(raw),)) + raw


def long(raw: bytes) -> bytes:
    return len(raw).to_bytes(4, "big") + raw


any_text = st.one_of(st.text(max_size=12).map(str.encode), st.binary(max_size=12))
entry_values = st.one_of(
    any_text.map(lambda b: b"S" + long(b)),
    st.binary(min_size=1, max_size=9),  # a type byte and whatever follows
    any_text.map(lambda b: b"S" + (len(b) + 7).to_bytes(4, "big") + b),  # a length that lies
    values.map(encode.encode_table_value),  # any type, as pamqp writes it
)
keys = st.one_of(st.text(max_size=8).map(str.encode), any_text)


@st.composite
def raw_tables(draw: st.DrawFn) -> bytes:
    """A table whose stated length is its entries', or cuts into them, or runs past them."""
    entries = b"".join(short(k) + v for k, v in draw(st.lists(st.tuples(keys, entry_values),
                                                                 max_size=3)))  # fmt: skip
    stated = max(0, len(entries) + draw(st.sampled_from([0, 0, 0, -1, -3, 2])))
    return stated.to_bytes(4, "big") + entries


raw_values = {
    "shortstr": any_text.map(short),
    "table": raw_tables(),
    "octet": st.binary(min_size=1, max_size=1),
    "timestamp": st.binary(min_size=8, max_size=8),
}


@st.composite
def raw_header(draw: st.DrawFn) -> bytes:
    flags = draw(st.one_of(st.integers(0, 2**16 - 1), st.just(0x2000)))  # headers alone, often
    parts = [b"\x00\x3c\x00\x00", draw(st.binary(min_size=8, max_size=8)), flags.to_bytes(2, "big")]
    for name, flag, _, _ in wire._PROPERTIES:
        if flags & flag:
            parts.append(draw(raw_values[getattr(spec.Basic.Properties, "_" + name)]))
    return b"".join(parts)


raw_methods = st.one_of(
    st.tuples(any_text, st.binary(min_size=9, max_size=9), any_text, any_text).map(
        lambda p: (
            spec.Basic.Deliver.index.to_bytes(4, "big")
            + short(p[0])
            + p[1]
            + short(p[2])
            + short(p[3])
        )
    ),
    st.binary(min_size=9, max_size=9).map(lambda b: spec.Basic.Ack.index.to_bytes(4, "big") + b),
)


@settings(max_examples=1500, deadline=None)
@given(st.one_of(raw_methods.map(lambda p: (1, p)), raw_header().map(lambda p: (2, p))),
       st.binary(max_size=3), st.booleans(), st.data())  # fmt: skip
def test_any_field_on_the_wire_decodes_or_fails_as_with_pamqp(
    frame: tuple[int, bytes], tail: bytes, good_end: bool, data: st.DataObject
) -> None:
    kind, payload = frame
    payload += tail
    raw = (kind.to_bytes(1, "big") + b"\x00\x01" + len(payload).to_bytes(4, "big") + payload
           + (b"\xce" if good_end else b"\x00"))  # fmt: skip
    for sample in (raw, raw[: data.draw(st.integers(0, len(raw)))]):
        as_pamqp(sample)


def test_the_frames_of_every_message_take_the_fast_path() -> None:
    """Not pamqp decoding them after all: the comparisons above would pass either way."""
    for frame in (
        spec.Basic.Deliver(
            consumer_tag="c", delivery_tag=7, redelivered=True, exchange="e", routing_key="r"
        ),
        spec.Basic.Ack(delivery_tag=7, multiple=True),
        ContentHeader(0, 2, spec.Basic.Properties(message_id="m", headers={"x-order-id": "o"})),
        ContentBody(b"{}"),
    ):
        assert wire._decoded(wire.ORIGINAL_MARSHAL(frame, 1)) is not None


def test_a_header_name_over_128_bytes_is_cut_as_pamqp_cuts_it() -> None:
    header = ContentHeader(0, 1, spec.Basic.Properties(headers={"k" * 200: "v", "x": "y"}))
    assert wire.marshal(header, 1) == wire.ORIGINAL_MARSHAL(header, 1)


def test_headers_of_every_type_decode_as_pamqp_decodes_them() -> None:
    every = {"text": "é", "byte": -5, "short": -3000, "ushort": 40000, "int": -70000,
             "uint": 3_000_000_000, "long": -(2**40), "yes": True, "none": None,
             "float": 1.5, "decimal": decimal.Decimal("1.25"), "table": {"a": [1, "b"]},
             "list": [1, "x", None], "when": datetime.datetime(2026, 12, 5, tzinfo=datetime.UTC),
             "raw": bytearray(b"\xff\x00")}  # fmt: skip
    header = ContentHeader(0, 1, spec.Basic.Properties(headers=every, message_id="m"))  # type: ignore[arg-type]
    raw = wire.ORIGINAL_MARSHAL(header, 1)
    assert wire.marshal(header, 1) == raw
    assert outcome(wire.unmarshal, raw) == outcome(wire.ORIGINAL_UNMARSHAL, raw)
    assert wire._decoded(raw) is not None


DECODERS = pytest.mark.parametrize(
    "unmarshal", [wire.unmarshal, wire.guarded_unmarshal], ids=["fast", "fast frames off"]
)


FAR = b"\xff" * 8  # milliseconds past the year 584 million: pamqp's datetime overflows


ORDER = short(b"x-order-id") + b"S" + long(b"o-1")  # the header every test frame keeps whole


def _properties_frame(flags: int, *fields: bytes) -> bytes:
    """A content header frame with these property flags and their fields, in wire order."""
    payload = b"\x00\x3c\x00\x00" + (3).to_bytes(8, "big") + flags.to_bytes(2, "big")
    payload += b"".join(fields)
    return b"\x02\x00\x01" + len(payload).to_bytes(4, "big") + payload + b"\xce"


def _header_frame(table: bytes, flags: int, timestamp: bytes = b"") -> bytes:
    """Headers (``table``), the message id ``m-1`` and maybe a timestamp."""
    return _properties_frame(flags, long(table), short(b"m-1"), timestamp)


def _one_header(name: bytes, value: bytes) -> bytes:
    """A frame whose headers are ``name`` with ``value`` (raw, its type first) and ``ORDER``."""
    return _header_frame(short(name) + value + ORDER, 0x2000 | 0x80)


def _marked(name: str, why: str) -> dict[str, str]:
    """The headers of ``_one_header``'s frame when its value was skipped for ``why``."""
    return {name: wire.UNDECODED, "x-order-id": "o-1", wire.UNREADABLE: why}


def _nested(depth: int, kind: bytes) -> bytes:
    """A table (F) or array (A) value nested ``depth`` deep, as a hostile publisher writes it."""
    inner = b"\x00\x00\x00\x00"
    for _ in range(depth):
        item = (b"\x01a" if kind == b"F" else b"") + kind + inner
        inner = len(item).to_bytes(4, "big") + item
    return kind + inner


@DECODERS
@pytest.mark.parametrize("kind", [b"F", b"A"])
def test_a_header_nested_deeper_than_python_recurses_arrives_marked(
    kind: bytes, unmarshal: Callable[[bytes], Any]
) -> None:
    """pamqp raises RecursionError in aiormq's reader, which closes the connection (the message
    comes back on every reconnect); here it arrives, the other headers whole."""
    raw = _one_header(b"deep", _nested(3000, kind))
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)  # Python's default, as the services run (a library may raise it)
    try:
        with pytest.raises(RecursionError):
            wire.ORIGINAL_UNMARSHAL(raw)
        used, channel, header = unmarshal(raw)
    finally:
        sys.setrecursionlimit(limit)
    assert (used, channel) == (len(raw), 1)
    assert header.properties.message_id == "m-1"
    assert header.properties.headers == _marked(
        "deep", "header 'deep': nested too deeply to decode"
    )


@DECODERS
def test_a_timestamp_property_out_of_range_arrives_marked(
    unmarshal: Callable[[bytes], Any],
) -> None:
    """RabbitMQ passes any 64 bits on; pamqp raised in aiormq's reader, which closed the
    connection on every redelivery (measured through the broker)."""
    raw = _header_frame(ORDER, 0x2000 | 0x80 | 0x40, FAR)
    with pytest.raises(pamqp.exceptions.UnmarshalingException, match="out of range"):
        wire.ORIGINAL_UNMARSHAL(raw)
    used, _, header = unmarshal(raw)
    assert used == len(raw)
    assert (header.properties.message_id, header.properties.timestamp) == ("m-1", None)
    assert header.properties.headers["x-order-id"] == "o-1"
    assert header.properties.headers[wire.UNREADABLE].startswith(
        "property 'timestamp': year 584556019 is out of range"
    )


@pytest.mark.parametrize(
    "value",
    [b"T" + FAR, b"A" + long(b"T" + FAR), b"F" + long(short(b"t") + b"A" + long(b"T" + FAR))],
    ids=["header", "in an array", "in a table in an array"],
)
@DECODERS
def test_a_header_timestamp_out_of_range_arrives_marked(
    value: bytes, unmarshal: Callable[[bytes], Any]
) -> None:
    raw = _one_header(b"when", value)
    with pytest.raises(pamqp.exceptions.UnmarshalingException):
        wire.ORIGINAL_UNMARSHAL(raw)
    used, _, header = unmarshal(raw)
    assert used == len(raw)
    assert header.properties.message_id == "m-1"
    assert header.properties.headers == _marked(
        "when", "header 'when': year 584556019 is out of range"
    )


@DECODERS
@pytest.mark.parametrize(
    "value", [b"A" + long(b"0"), b"F" + long(short(b"k") + b"0")], ids=["array", "table"]
)
def test_a_value_of_an_unknown_type_is_pamqps_error(
    value: bytes, unmarshal: Callable[[bytes], Any]
) -> None:
    """Only what a broker passes on is skipped and marked: a type no broker sends (a frame
    corrupted on the way) fails the frame as pamqp fails it. Found by the corruption test: a
    header's array holding type ``0`` arrived marked."""
    raw = _one_header(b"bad", value)
    assert outcome(unmarshal, raw) == outcome(wire.ORIGINAL_UNMARSHAL, raw)
    assert outcome(unmarshal, raw)[0] == "raised"


@DECODERS
def test_a_value_skipped_for_its_timestamp_is_not_read_further(
    unmarshal: Callable[[bytes], Any],
) -> None:
    """pamqp stops at the first error: an array with a timestamp out of range and, after it, a
    type no broker sends is skipped whole and marked for the timestamp (refused either way)."""
    value = b"A" + long(b"T" + FAR + b"0")
    raw = _one_header(b"bad", value)
    _, _, header = unmarshal(raw)
    assert header.properties.headers == _marked(
        "bad", "header 'bad': year 584556019 is out of range"
    )


@DECODERS
def test_a_value_whose_length_runs_past_its_table_is_pamqps_error(
    unmarshal: Callable[[bytes], Any],
) -> None:
    """Skipping by a stated length only within the table: past it, the frame is malformed."""
    table = short(b"when") + b"A" + (50).to_bytes(4, "big") + b"T" + FAR
    raw = _header_frame(table, 0x2000 | 0x80)
    assert outcome(unmarshal, raw) == outcome(wire.ORIGINAL_UNMARSHAL, raw)
    assert outcome(unmarshal, raw)[0] == "raised"


NOT_UTF8 = b"\xff\xfe"  # RabbitMQ checks no short string: it passes these on (measured)


@DECODERS
@pytest.mark.parametrize(
    ("flags", "fields", "name"),
    [
        (0x2000 | 0x80, [long(ORDER), short(NOT_UTF8)],
         "message_id"),
        (0x8000 | 0x2000, [short(NOT_UTF8), long(ORDER)],
         "content_type"),
    ],
    ids=["message id", "content type, before the headers"],
)  # fmt: skip
def test_a_property_that_is_not_utf8_is_left_out_and_marked(
    flags: int, fields: list[bytes], name: str, unmarshal: Callable[[bytes], Any]
) -> None:
    """pamqp's ``short_str`` raised in aiormq's reader (it closed the connection on every
    redelivery, measured through the broker); the mark outlives the headers table, which
    comes after the content type."""
    raw = _properties_frame(flags, *fields)
    with pytest.raises(pamqp.exceptions.UnmarshalingException, match="utf-8"):
        wire.ORIGINAL_UNMARSHAL(raw)
    used, _, header = unmarshal(raw)
    assert used == len(raw)
    assert getattr(header.properties, name) is None
    assert header.properties.headers == {
        "x-order-id": "o-1",
        wire.UNREADABLE: f"property {name!r}: not UTF-8 (byte 0xff at 0)",
    }


@DECODERS
def test_a_header_whose_name_is_not_utf8_is_left_out_and_marked(
    unmarshal: Callable[[bytes], Any],
) -> None:
    nested = b"F" + long(short(NOT_UTF8) + b"S" + long(b"v"))
    table = (short(NOT_UTF8) + b"S" + long(b"v") + short(b"inner") + nested
             + ORDER)  # fmt: skip
    raw = _properties_frame(0x2000, long(table))
    with pytest.raises(pamqp.exceptions.UnmarshalingException, match="utf-8"):
        wire.ORIGINAL_UNMARSHAL(raw)
    _, _, header = unmarshal(raw)
    assert header.properties.headers == {
        "inner": wire.UNDECODED,
        "x-order-id": "o-1",
        wire.UNREADABLE: "a header's name: not UTF-8 (byte 0xff at 0)",
    }


@DECODERS
def test_a_routing_key_that_is_not_utf8_arrives_escaped(unmarshal: Callable[[bytes], Any]) -> None:
    """A publisher chooses it, and ``saga.*`` routes ``saga.\\xff`` to the intake: pamqp's
    error closed the intake's connection on every redelivery."""
    payload = (spec.Basic.Deliver.index.to_bytes(4, "big") + short(b"ctag") + (9).to_bytes(8, "big")
               + b"\x00" + short(b"ex") + short(b"saga." + NOT_UTF8))  # fmt: skip
    raw = b"\x01\x00\x01" + len(payload).to_bytes(4, "big") + payload + b"\xce"
    with pytest.raises(pamqp.exceptions.UnmarshalingException):
        wire.ORIGINAL_UNMARSHAL(raw)
    used, _, deliver = unmarshal(raw)
    assert used == len(raw)
    assert (deliver.consumer_tag, deliver.delivery_tag, deliver.exchange) == ("ctag", 9, "ex")
    assert deliver.routing_key == "saga.\\xff\\xfe"


@DECODERS
def test_the_reason_is_the_decoders_own_over_one_a_sender_wrote(
    unmarshal: Callable[[bytes], Any],
) -> None:
    """A sender's own ``x-saga-unreadable`` header cannot stand in for what was not decoded."""
    forged = short(wire.UNREADABLE.encode()) + b"S" + long(b"all is well")
    for table, flags, stamp in (
        (short(b"when") + b"T" + FAR + forged, 0x2000 | 0x80, b""),
        (forged, 0x2000 | 0x80 | 0x40, FAR),
    ):
        _, _, header = unmarshal(_header_frame(table, flags, stamp))
        assert "year 584556019 is out of range" in header.properties.headers[wire.UNREADABLE]
