"""Logging that stays bounded whatever arrives: the same complaint is logged a few times a
minute, then counted, so a flood of bad messages cannot fill a disk with log lines."""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# What a log line may say about the message it is about (``extra=`` of the logging call).
CONTEXT = ("saga_id", "order_id", "action", "message_id", "queue")
# ``extra=`` key of a traceback kept as text (a stored failure's): it goes where an exception's
# does, the ``traceback`` key of a JSON line, after the line in text.
TRACEBACK = "stored_traceback"


def _traceback_of(record: logging.LogRecord, formatter: logging.Formatter) -> str:
    if record.exc_info:
        return formatter.formatException(record.exc_info)
    return str(getattr(record, TRACEBACK, "") or "")


class TextLines(logging.Formatter):
    """The text format, with a stored traceback after its line as an exception's would be."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        stored = "" if record.exc_info else _traceback_of(record, self)
        return f"{line}\n{stored}" if stored else line


class JsonLines(logging.Formatter):
    """One JSON object per line: time, level, logger, message, the context fields the call
    gave, and the traceback when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        line.update({k: getattr(record, k) for k in CONTEXT if getattr(record, k, None)})
        trace = _traceback_of(record, self)
        if trace:
            line["traceback"] = trace
        return json.dumps(line, default=str)


def context(**fields: object) -> dict[str, object]:
    """``extra=`` for a log call: the context fields that are set."""
    return {k: v for k, v in fields.items() if k in CONTEXT and v}


class RateLimit(logging.Filter):
    """At most ``per_window`` records per (logger, message template) each ``window_s``; the
    first record after a window says how many were suppressed. Tracebacks beyond the first of
    a window are dropped too."""

    MAX_KEYS = 2_000

    def __init__(
        self,
        per_window: int = 10,
        window_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.per_window = per_window
        self.window_s = window_s
        self._clock = clock
        self._seen: dict[tuple[str, str], tuple[float, int, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        key = (record.name, str(record.msg))
        now = self._clock()
        start, count, suppressed = self._seen.get(key, (now, 0, 0))
        if now - start >= self.window_s:
            if suppressed:
                record.msg = f"{record.msg} [{suppressed} similar suppressed]"
            start, count, suppressed = now, 0, 0
        count += 1
        allowed = count <= self.per_window
        if not allowed:
            suppressed += 1
        elif count > 1:
            record.exc_info = None
            record.exc_text = None
        if len(self._seen) >= self.MAX_KEYS and key not in self._seen:
            self._seen.clear()
        self._seen[key] = (start, count, suppressed)
        return allowed


class OneLine(logging.Filter):
    """A library's retry of a lost connection: its message and the error on one line, the
    traceback only at DEBUG (asyncpg's pool logs one per attempt while a database is away)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.levelno < logging.ERROR and not log_debug():
            error = record.exc_info[1]
            record.msg = f"{record.getMessage()}: {error!r}"
            record.args = None
            record.exc_info = None
            record.exc_text = None
        return True


class BrokerLines(logging.Filter):
    """The AMQP libraries' lines, one per event. A lost or refused connection is one line per
    retry: aio-pika's "Reconnecting after", with the last connection error aiormq reported
    folded into it (the error's own line dropped; with several connections to one broker, it is
    the same error). A channel or connection the libraries recover logs its message
    and error on one line, the traceback only at DEBUG. A connection the broker dropped is a
    warning, not an error, and said once, not once per channel (a coordinator logged twelve
    errors for one drop it recovered from at once); ``Bus`` says when it is connected again.
    While the process waits for the broker at its start (``waiting``), its own line says so and
    theirs are dropped."""

    LIBRARIES = ("aiormq.", "aio_pika.")
    # Said again for each channel of a dropped connection, or twice for one drop (the
    # connection's own line says it, and the channels come back with the connection): dropped.
    ECHOES = (
        ("aio_pika.tools", ("RobustChannel._on_close", "error: RuntimeError: <Connection")),
        ("aiormq.connection", ("Cancelling cause reader exited abnormally",)),
    )
    # An error the libraries recover from on their own (the robust connection reconnects).
    RECOVERED = (("aiormq.connection", ("Unexpected connection close from remote",)),)

    def __init__(self) -> None:
        super().__init__()
        self.waiting = False
        self._error: str | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith(self.LIBRARIES):
            return True
        if self.waiting:
            return False
        said = record.getMessage()
        if _said(record.name, said, self.ECHOES):
            return False
        if _said(record.name, said, self.RECOVERED):
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        if said.startswith("error when creating transport: "):
            self._error = said.removeprefix("error when creating transport: ")
            return False
        if "Reconnecting after" in said and self._error is not None:
            said = said.replace(" closed.", f" closed ({self._error}).", 1)
            self._error = None
        if record.exc_info and not log_debug():
            said = f"{said}: {record.exc_info[1]!r}"
            record.exc_info = None
            record.exc_text = None
        record.msg, record.args = said, None
        return True


def _said(logger: str, said: str, lines: tuple[tuple[str, tuple[str, ...]], ...]) -> bool:
    """Whether ``said`` by ``logger`` is one of ``lines`` (a logger and the parts it holds)."""
    return any(logger == name and all(p in said for p in parts) for name, parts in lines)


BROKER_LINES = BrokerLines()


@contextlib.contextmanager
def waiting_for_the_broker() -> Iterator[None]:
    """While a process waits for the broker at its start, its own line says so, once a try."""
    BROKER_LINES.waiting = True
    try:
        yield
    finally:
        BROKER_LINES.waiting = False


def log_debug() -> bool:
    return logging.getLogger().isEnabledFor(logging.DEBUG)


def configure(level: str, fmt: str = "text") -> None:
    """Root logging for every ``saga`` process: one format (``text`` or ``json``, one object
    per line), bounded output."""
    if fmt not in ("text", "json"):
        raise ValueError(f"SAGA_LOG_FORMAT {fmt!r}: use text or json")
    logging.basicConfig(level=level.upper(), format=FORMAT)
    pool_log = logging.getLogger("asyncpg.pool")
    if not any(isinstance(f, OneLine) for f in pool_log.filters):
        pool_log.addFilter(OneLine())
    limit = RateLimit()
    for handler in logging.getLogger().handlers:
        handler.addFilter(BROKER_LINES)
        handler.addFilter(limit)
        handler.setFormatter(JsonLines() if fmt == "json" else TextLines(FORMAT))
