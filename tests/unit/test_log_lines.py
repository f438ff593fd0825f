"""Log lines as an operator reads them: a retried delivery is one line with its error, the
traceback goes with a dead letter (or at DEBUG), and SAGA_LOG_FORMAT=json gives one object per
line with the message's context."""

from __future__ import annotations

import json
import logging
import sys
from types import SimpleNamespace
from typing import Any, cast

import pytest
from aio_pika.abc import AbstractIncomingMessage

from saga_shared.errors import InvalidMessage
from saga_shared.observability.logs import JsonLines, OneLine, configure, context
from saga_shared.transport.delivery import Outcome, _judge


def delivery() -> AbstractIncomingMessage:
    message = SimpleNamespace(
        message_id="m-1", type="action.request", routing_key="erp", headers={"x-order-id": "o-1"}
    )
    return cast(AbstractIncomingMessage, message)


def fail() -> Exception:
    try:
        raise KeyError("credit_note_id")
    except KeyError as exc:
        return exc


def test_a_retried_delivery_is_one_line_with_its_error(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="saga_shared.transport.delivery"):
        outcome = _judge(delivery(), fail())

    [record] = caplog.records
    assert outcome is Outcome.RETRY
    assert record.levelno == logging.WARNING
    assert not record.exc_info  # no traceback
    assert "KeyError('credit_note_id') -> retry" in record.getMessage()
    assert (record.message_id, record.order_id) == ("m-1", "o-1")  # type: ignore[attr-defined]


def test_the_traceback_comes_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="saga_shared.transport.delivery"):
        _judge(delivery(), fail())

    assert caplog.records[0].exc_info


def test_a_message_refused_for_good_is_an_error_line(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="saga_shared.transport.delivery"):
        outcome = _judge(delivery(), InvalidMessage("body is not JSON"))

    assert outcome is Outcome.DEAD_LETTER
    assert caplog.records[0].levelno == logging.ERROR


def test_json_lines_carry_the_context_and_the_traceback() -> None:
    record = logging.LogRecord("saga_services.adapter", logging.WARNING, __file__, 1,
                               "call %s failed", ("erp.void",), None)  # fmt: skip
    for key, value in context(saga_id="s-1", order_id="o-1", action="erp.void", nope="x").items():
        setattr(record, key, value)
    error = fail()
    record.exc_info = (type(error), error, error.__traceback__)

    line: dict[str, Any] = json.loads(JsonLines().format(record))

    assert line["level"] == "warning" and line["logger"] == "saga_services.adapter"
    assert line["message"] == "call erp.void failed"
    assert (line["saga_id"], line["order_id"], line["action"]) == ("s-1", "o-1", "erp.void")
    assert "nope" not in line
    assert "KeyError: 'credit_note_id'" in line["traceback"]
    assert line["ts"].endswith("+00:00")


def test_an_unknown_log_format_is_refused() -> None:
    with pytest.raises(ValueError, match="SAGA_LOG_FORMAT 'xml'"):
        configure("INFO", "xml")


def test_a_librarys_reconnection_warning_is_one_line() -> None:
    try:
        raise ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 1)")
    except ConnectionRefusedError:
        record = logging.LogRecord(
            "asyncpg.pool", logging.WARNING, __file__, 1, "Failed to restore the %s floor",
            ("pool",), sys.exc_info(),
        )  # fmt: skip
    assert OneLine().filter(record)
    assert record.exc_info is None
    assert record.getMessage() == (
        'Failed to restore the pool floor: ConnectionRefusedError(111, "Connect call failed '
        "('127.0.0.1', 1)\")"
    )


def test_a_stored_traceback_goes_to_its_key_not_into_the_message() -> None:
    from saga_shared.observability.logs import TRACEBACK, TextLines

    stored = 'Traceback (most recent call last):\n  File "x.py", line 1\nKeyError: 1'
    record = logging.LogRecord("saga_coordinator.dead_letters", logging.WARNING, __file__, 1,
                               "dead letter %s: %s", (7, "KeyError: 1"), None)  # fmt: skip
    record.__dict__[TRACEBACK] = stored
    line = json.loads(JsonLines().format(record))
    assert line["message"] == "dead letter 7: KeyError: 1"
    assert line["traceback"] == stored
    text = TextLines("%(message)s").format(record)
    assert text == f"dead letter 7: KeyError: 1\n{stored}"
