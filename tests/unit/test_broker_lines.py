"""One line per event from the AMQP libraries, and every line of a JSON log is JSON."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time

import pytest

from saga_shared.observability.logs import BrokerLines


def emit(lines: BrokerLines, name: str, level: int, msg: str, *args: object,
         exc: BaseException | None = None) -> str | None:  # fmt: skip
    """What a handler with ``lines`` writes for one record: its text, or None if dropped."""
    info = (type(exc), exc, exc.__traceback__) if exc is not None else None
    record = logging.LogRecord(name, level, __file__, 1, msg, args, info)
    if not lines.filter(record):
        return None
    return logging.Formatter("%(name)s: %(message)s").format(record)


def test_a_lost_connection_is_one_line_per_retry_with_its_error() -> None:
    lines = BrokerLines()
    refused = ConnectionRefusedError(111, "Connection refused")
    error_line = emit(
        lines, "aiormq.connection", logging.ERROR, "error when creating transport: %r", refused
    )
    retry_line = emit(
        lines, "aio_pika.robust_connection", logging.INFO,
        "Connection to %s closed. Reconnecting after %r seconds.", "amqp://mq:5672/", 5,
    )  # fmt: skip
    assert error_line is None  # folded into the retry's line
    assert retry_line == (
        "aio_pika.robust_connection: Connection to amqp://mq:5672/ closed "
        "(ConnectionRefusedError(111, 'Connection refused')). Reconnecting after 5 seconds."
    )


def test_a_recovered_channels_traceback_is_one_line_and_waiting_drops_theirs() -> None:
    lines = BrokerLines()
    try:
        raise ConnectionResetError("node lost")
    except ConnectionResetError as exc:
        error = exc
    said = emit(lines, "aio_pika.robust_channel", logging.ERROR, "channel closed", exc=error)
    assert said == "aio_pika.robust_channel: channel closed: ConnectionResetError('node lost')"
    lines.waiting = True
    assert emit(lines, "aio_pika.robust_connection", logging.INFO, "Reconnecting after 5") is None
    assert emit(lines, "saga_app.cli", logging.WARNING, "waiting for the broker") is not None


def test_a_dropped_connection_is_a_warning_said_once_not_an_error_per_channel() -> None:
    lines = BrokerLines()
    drop = emit(
        lines, "aiormq.connection", logging.ERROR,
        'Unexpected connection close from remote "%s", %r', "amqp://mq:5672/", "CONNECTION_FORCED",
    )  # fmt: skip
    echoes = [
        emit(lines, "aiormq.connection", logging.WARNING,
             "Cancelling cause reader exited abnormally: %r", "ConnectionClosed(320)"),
        emit(lines, "aio_pika.tools", logging.ERROR, "Callback %r error: %s: %s",
             "<OneShotCallback: cb=<bound method RobustChannel._on_close of <...>>>",
             "RuntimeError", "<Connection: amqp://mq:5672/> closed"),
    ]  # fmt: skip
    other = emit(lines, "aio_pika.tools", logging.ERROR, "Callback %r error: %s", "cb", "KeyError")
    restore = emit(
        lines, "aio_pika.tools", logging.ERROR, "Callback %r error: %s: %s",
        "<... RobustChannel._on_close ...>", "ChannelNotFoundEntity", "NOT_FOUND",
    )  # fmt: skip
    assert drop is not None and drop.startswith("aiormq.connection: Unexpected connection close")
    record = logging.LogRecord("aiormq.connection", logging.ERROR, __file__, 1,
                               "Unexpected connection close from remote", None, None)  # fmt: skip
    assert lines.filter(record) and (record.levelno, record.levelname) == (30, "WARNING")
    assert echoes == [None, None]
    assert other is not None  # a callback failing otherwise is still said, at its level
    assert restore is not None  # a channel failing to come back is not an echo


@pytest.mark.timeout(60)
def test_every_line_of_a_json_log_is_json_while_the_broker_is_away() -> None:
    env = {
        **os.environ, "SAGA_LOG_FORMAT": "json", "SAGA_IDENTITY": "shared",
        "SAGA_METRICS_BIND": "off", "SAGA_AMQP_URL": "amqp://guest:guest@127.0.0.1:1/",
    }  # fmt: skip
    env.pop("SAGA_CONSOLE_USERS", None)
    process = subprocess.Popen(
        [sys.executable, "-m", "saga_app.cli", "run", "coordinator", "inventory"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    time.sleep(2.5)  # about three tries
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=30)
    lines = [line for line in (out + err).splitlines() if line.strip()]
    parsed = [json.loads(line) for line in lines]  # every line, or this raises
    waiting = [p for p in parsed if p["message"].startswith("waiting for the broker")]
    assert len(waiting) >= 2
    assert not [p for p in parsed if p["logger"].startswith(("aiormq", "aio_pika"))]
