"""The codec: every message survives a round trip; every bad body is refused with a reason that
names the problem (and the field), never a crash."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, cast

import pytest
from aio_pika.abc import AbstractIncomingMessage
from pydantic import TypeAdapter

from saga_shared.errors import InvalidMessage
from saga_shared.model.messages import (
    AbortSaga,
    ActionDone,
    ActionFailed,
    ActionRequest,
    CommandReply,
    Envelope,
    ResumeSaga,
    SagaEvent,
    StartSaga,
)
from saga_shared.model.text import first_unsafe
from saga_shared.transport.codec import (
    COMMANDS,
    CONTENT_TYPE,
    PARTITION,
    check_order_header,
    decode,
    encode,
    identify,
    message_to_amqp,
    order_header,
    peek,
)
from tests.unit.factories import REFUND_PARAMS, start_plan

LIMIT = 64 * 1024
WHEN = datetime(2025, 3, 1, 12, 30, 15, 123456, tzinfo=UTC)

START: dict[str, Any] = {
    "type": "saga.start",
    "saga_id": "saga-1",
    "order_id": "order-1",
    "saga": "refund",
    "params": {"sku": "A", "quantity": 1},
}
DONE: dict[str, Any] = {
    "type": "action.done",
    "saga_id": "saga-1",
    "order_id": "order-1",
    "action": "inventory.reserve_stock",
    "phase": "forward",
    "step": 0,
    "idempotency_key": "saga-1:inventory.reserve_stock",
    "result": {"reservation_id": "r-1"},
}


def body(raw: object) -> bytes:
    return json.dumps(raw).encode()


def refused(data: bytes, adapter: TypeAdapter[Any] = PARTITION, max_bytes: int = LIMIT) -> str:
    with pytest.raises(InvalidMessage) as info:
        decode(data, adapter, max_bytes=max_bytes)
    assert info.value.reason == str(info.value)
    return info.value.reason


# --- round trips ---------------------------------------------------------------------------------

PARTITION_MESSAGES: list[Envelope] = [
    StartSaga(
        saga_id="s-1",
        order_id="o-1",
        saga="refund",
        params=dict(REFUND_PARAMS),
        reply_to="amq.gen-x",
        timestamp=WHEN,
    ),
    start_plan(
        ["inventory.reserve_stock", "email.send_confirmation"],
        {"sku": "A", "quantity": 3, "customer_email": "a@b.c"},
        priority=["inventory.reserve_stock"],
    ),
    AbortSaga(saga_id="s-1", order_id="o-1", reason="customer cancelled", timestamp=WHEN),
    ResumeSaga(saga_id="s-1", order_id="o-1", note="fixed the ledger", reply_to="q"),
    ActionDone(
        saga_id="s-1",
        order_id="o-1",
        action="erp.create_credit_note",
        phase="forward",
        step=1,
        idempotency_key="s-1:erp.create_credit_note",
        attempt=2,
        tries=3,
        result={"credit_note_id": "cn-9", "nested": {"a": [1, 2.5, None, True]}},
    ),
    ActionFailed(
        saga_id="s-1",
        order_id="o-1",
        action="inventory.release_stock",
        phase="compensation",
        step=0,
        idempotency_key="s-1:inventory.release_stock:resume-1",
        reason="warehouse offline",
        effect_unknown=True,
    ),
]


@pytest.mark.parametrize("message", PARTITION_MESSAGES, ids=lambda m: m.type)
def test_partition_messages_round_trip(message: Envelope) -> None:
    decoded = decode(encode(message), PARTITION, max_bytes=LIMIT)

    assert type(decoded) is type(message)
    assert decoded == message


@pytest.mark.parametrize(
    "message", [m for m in PARTITION_MESSAGES if m.type.startswith("saga.")], ids=lambda m: m.type
)
def test_commands_round_trip(message: Envelope) -> None:
    decoded = decode(encode(message), COMMANDS, max_bytes=LIMIT)

    assert decoded == message


@pytest.mark.parametrize(
    "message",
    [
        ActionRequest(
            saga_id="s-1",
            order_id="o-1",
            action="payments.charge_card",
            phase="forward",
            step=1,
            idempotency_key="s-1:payments.charge_card",
            params={"amount_cents": 100, "card_token": "tok"},
            timeout_s=2.5,
        ),
        CommandReply(
            type="command.rejected",
            saga_id="s-1",
            order_id="o-1",
            command_id="c-1",
            command_type="saga.start",
            reason="no saga named 'x' [unknown_saga]",
        ),
        SagaEvent(
            type="saga.needs_human",
            saga_id="s-1",
            order_id="o-1",
            saga="refund",
            status="needs_human",
            step=2,
            action="erp.create_credit_note",
            detail="void failed",
            saga_register={"status": "needs_human", "steps": [{"index": 0}]},
        ),
    ],
    ids=lambda m: m.type,
)
def test_outgoing_messages_round_trip(message: Envelope) -> None:
    adapter: TypeAdapter[Any] = TypeAdapter(type(message))

    assert decode(encode(message), adapter, max_bytes=LIMIT) == message


def test_timestamps_keep_their_timezone_and_microseconds() -> None:
    message = AbortSaga(saga_id="s", order_id="o", reason="r", timestamp=WHEN)

    decoded = decode(encode(message), PARTITION, max_bytes=LIMIT)

    assert decoded.timestamp == WHEN
    assert decoded.timestamp.utcoffset() is not None


def test_amqp_message_carries_id_type_order_and_persistence() -> None:
    message = AbortSaga(saga_id="s-1", order_id="order-7", reason="r")

    amqp = message_to_amqp(message)

    assert amqp.body == encode(message)
    p = amqp.properties
    assert p.message_id == message.message_id
    assert p.message_type == "saga.abort"
    assert p.content_type == CONTENT_TYPE
    assert p.headers == {"x-order-id": "order-7"}
    assert p.delivery_mode == 2


# --- refusals ------------------------------------------------------------------------------------


def test_body_over_the_limit_is_refused_before_parsing() -> None:
    data = body(START)

    reason = refused(data, max_bytes=len(data) - 1)

    assert "over the limit" in reason
    assert str(len(data)) in reason
    assert str(len(data) - 1) in reason


def test_body_exactly_at_the_limit_is_accepted() -> None:
    data = body(START)

    assert isinstance(decode(data, PARTITION, max_bytes=len(data)), StartSaga)


def test_oversized_garbage_is_refused_for_its_size() -> None:
    assert "over the limit" in refused(b"\xff" * 2000, max_bytes=1024)


def test_invalid_utf8_is_refused() -> None:
    reason = refused(b'{"type": "saga.start", "x": "\xff"}')

    assert "not valid UTF-8" in reason
    assert "byte 29" in reason


@pytest.mark.parametrize("data", [b"", b"not json", b'{"type": "saga.start"', b"{'a': 1}"])
def test_not_json_is_refused(data: bytes) -> None:
    assert "not JSON" in refused(data)


@pytest.mark.parametrize("raw", [[START], "saga.start", 42, None, True])
def test_json_that_is_not_an_object_is_refused(raw: object) -> None:
    assert refused(body(raw)) == "body must be a JSON object"


def test_unknown_type_is_refused_naming_it() -> None:
    reason = refused(body({**START, "type": "saga.explode"}))

    assert "saga.explode" in reason
    assert "saga.start" in reason  # and says what is expected


def test_missing_type_is_refused() -> None:
    raw = {k: v for k, v in START.items() if k != "type"}

    assert "'type'" in refused(body(raw))


def test_a_partition_only_type_is_refused_on_the_commands_queue() -> None:
    reason = refused(body(DONE), COMMANDS)

    assert "action.done" in reason


@pytest.mark.parametrize("missing", ["saga_id", "order_id", "idempotency_key", "result", "step"])
def test_missing_field_is_refused_naming_it(missing: str) -> None:
    raw = {k: v for k, v in DONE.items() if k != missing}

    reason = refused(body(raw))

    assert reason == f"{missing}: Field required"


def test_extra_field_is_refused_naming_it_without_the_type_tag() -> None:
    reason = refused(body({**START, "colour": "red"}))

    assert reason == "colour: Extra inputs are not permitted"
    assert "saga.start" not in reason


def test_nested_problem_is_refused_with_its_path() -> None:
    raw = {**START, "saga": None, "plan": {"steps": [{"action": "Not An Action"}]}}

    reason = refused(body(raw))

    assert reason.startswith("plan.steps.0.action: ")
    assert "saga.start" not in reason


def test_every_problem_is_listed() -> None:
    raw = {**DONE, "step": -1, "phase": "sideways"}

    reason = refused(body(raw))

    assert "step: " in reason
    assert "phase: " in reason
    assert len(reason.split("; ")) == 2


def test_start_with_both_saga_and_plan_is_refused() -> None:
    raw = {**START, "plan": {"steps": [{"action": "erp.validate_address"}]}}

    assert "exactly one of 'saga'" in refused(body(raw))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("saga_id", ""),
        ("saga_id", "has space"),
        ("order_id", "x" * 129),
        ("schema_version", 2),
        ("timestamp", "yesterday"),
    ],
)
def test_bad_envelope_values_are_refused_naming_the_field(field: str, value: object) -> None:
    reason = refused(body({**START, field: value}))

    assert reason.startswith(f"{field}: ")


# --- peek ----------------------------------------------------------------------------------------

NOTHING = dict.fromkeys(("message_id", "type", "saga_id", "order_id", "reply_to"))


@pytest.mark.parametrize(
    "data", [b"", b"garbage", b"\xff\xfe\x00", b"[1, 2]", b'"text"', b"null", b"{"]
)
def test_peek_on_garbage_returns_nothing_and_does_not_raise(data: bytes) -> None:
    assert peek(data) == NOTHING


def test_peek_reads_the_identifiers_of_an_invalid_message() -> None:
    raw = {
        "message_id": "m-1",
        "type": "saga.start",
        "saga_id": "s-1",
        "order_id": "o-1",
        "reply_to": "amq.gen-q",
        "colour": "red",
    }

    assert peek(body(raw)) == {
        "message_id": "m-1",
        "type": "saga.start",
        "saga_id": "s-1",
        "order_id": "o-1",
        "reply_to": "amq.gen-q",
    }


def test_peek_keeps_only_well_formed_identifiers() -> None:
    raw = {"message_id": 7, "type": ["x"], "saga_id": "s" * 129, "order_id": "o" * 128}

    assert peek(body(raw)) == {**NOTHING, "order_id": "o" * 128}


@pytest.mark.parametrize(
    "bad",
    ["'; DROP TABLE sagas; --", "a\u0000b", "line\nbreak", "\u001b[2J", "caf\u00e9", "\ud800"],
)
def test_peek_drops_identifiers_a_reply_could_not_carry(bad: str) -> None:
    data = body({"message_id": bad, "saga_id": bad, "order_id": bad, "reply_to": bad})

    assert peek(data) == NOTHING


def test_identify_prefers_the_body_then_the_amqp_property_then_a_hash() -> None:
    assert identify(b'{"message_id": "m-1"}', "p-1", {}).message_id == "m-1"
    assert identify(b"{garbage", "p-1", {}).message_id == "p-1"
    assert identify(b"{garbage", "bad id!", {}).transport_id is None
    hashed = identify(b"{garbage", None, {}).message_id
    assert hashed.startswith("body:") and hashed == identify(b"{garbage", None, {}).message_id


def test_identify_takes_the_order_from_the_body_not_a_header() -> None:
    found = identify(b'{"order_id": "mine"}', None, {"x-order-id": "victim"})

    assert found.order_id == "mine"


# --- hostile bodies ------------------------------------------------------------------------------


def test_a_deeply_nested_body_is_refused_without_recursion() -> None:
    deep = b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"

    assert "nested deeper than" in refused(deep, max_bytes=len(deep))


def test_nesting_just_past_the_limit_is_refused_and_just_under_accepted() -> None:
    def nested(depth: int) -> dict[str, Any]:
        value: Any = "leaf"
        for _ in range(depth):
            value = [value]
        return {**DONE, "result": {"deep": value}}

    assert "nested deeper than 32" in refused(body(nested(31)))
    decode(body(nested(29)), PARTITION, max_bytes=LIMIT)


def test_too_many_values_are_refused() -> None:
    raw = {**DONE, "result": {"many": list(range(20_000))}}

    assert "more than 10000 values" in refused(body(raw), max_bytes=10**6)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('{"a": NaN}', "NaN"),
        ('{"a": Infinity}', "Infinity"),
        ('{"a": 1e400}', "number too large"),
        ('{"a": 100000000000000000000}', "64-bit"),
        ('{"a": ' + "9" * 5000 + "}", "acceptable JSON"),
    ],
)
def test_numbers_json_or_columns_cannot_hold_are_refused(text: str, words: str) -> None:
    assert words in refused(text.encode())


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("a\u0000b", "control character (U+0000)"),
        ("\ud800", "lone surrogate (U+D800)"),
        ("\u001b[31mred", "control character (U+001B)"),
        ("\u009b", "control character (U+009B)"),
    ],
)
def test_characters_postgres_or_a_terminal_cannot_take_are_refused(value: str, words: str) -> None:
    reason = refused(body({"type": "action.done", "result": {"note": value}}))
    assert words in reason and "result.note" in reason


def test_an_unsafe_key_is_refused_too() -> None:
    assert "a key" in refused(body({"type": "saga.start", "params": {"a\u0000": 1}}))


def test_tabs_and_newlines_are_ordinary_text() -> None:
    raw = {**DONE, "result": {"reservation_id": "r-1", "note": "two\nlines\tand a tab"}}

    decoded = decode(body(raw), PARTITION, max_bytes=LIMIT)
    assert isinstance(decoded, ActionDone) and decoded.result["note"] == "two\nlines\tand a tab"


def test_a_refusal_never_repeats_a_control_character_it_was_sent() -> None:
    raw = {**START, "colour\u001b[2J": "blue", "reply_to": "\u001b]0;pwned\u0007"}

    reason = refused(body(raw), COMMANDS)
    assert first_unsafe(reason) is None and "a key" in reason


class _Headers:
    def __init__(self, headers: dict[str, object]) -> None:
        self.headers = headers


@pytest.mark.parametrize(
    ("headers", "named"),
    [
        ({"x-order-id": "A-1"}, "A-1"),
        ({"x-order-id": b"A-1"}, "A-1"),
        ({"x-order-id": ""}, None),
        ({"x-order-id": 7}, None),  # not text: the delivery goes alone
        ({}, None),
    ],
)
def test_the_order_header_names_an_order_or_none(headers: dict[str, object], named: str) -> None:
    assert order_header(cast(AbstractIncomingMessage, _Headers(headers))) == named


def test_an_order_header_naming_another_order_than_the_body_is_refused() -> None:
    delivery = cast(AbstractIncomingMessage, _Headers({"x-order-id": "B-2\x1b"}))
    with pytest.raises(InvalidMessage, match=r"header x-order-id 'B-2\\x1b' names another order "
                       r"than the body's order_id 'A-1'"):  # fmt: skip
        check_order_header(delivery, "A-1")
    check_order_header(cast(AbstractIncomingMessage, _Headers({"x-order-id": "A-1"})), "A-1")
    check_order_header(cast(AbstractIncomingMessage, _Headers({})), "A-1")
