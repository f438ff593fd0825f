"""The Health page's figures from heartbeat rows and queue depths, and how moments are shown."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from saga_app.console.health import health, process_of
from saga_app.console.settings import ConsoleSettings
from saga_app.console.web import when
from saga_shared.config import Settings
from saga_shared.errors import ConfigError
from saga_shared.transport.bus import QueueDepth
from saga_shared.transport.topology import Topology

TOPOLOGY = Topology.from_settings(Settings(namespace="n", partitions=4))
T0 = datetime(2026, 12, 7, 3, 0, tzinfo=UTC)


def row(**changes: Any) -> dict[str, Any]:
    base = {
        "id": "h:1:coordinator:abc", "kind": "coordinator", "name": "coordinator", "host": "h",
        "pid": 1, "version": "0.2.0", "started_at": T0, "beat_at": T0 + timedelta(seconds=10),
        "stopped_at": None, "queues": '{"n.partition.1": 30, "n.partition.2": 5}',
        "before": '{"n.partition.1": 10, "n.partition.2": 5}',
        "before_at": T0 + timedelta(seconds=5), "quiet_s": 1.0, "partitions": [3, 0],
    }  # fmt: skip
    return base | changes


def test_a_process_beating_in_time_is_alive_with_its_rates_and_the_partitions_it_holds() -> None:
    p = process_of(row(), silent_after_s=15)
    assert p.state == "alive"
    assert p.per_s == {"n.partition.1": 4.0, "n.partition.2": 0.0}
    # What it holds the locks of, idle or not: not what delivered to it since the last beat
    assert p.partitions == (0, 3)
    assert process_of(row(kind="adapter", partitions=None), 15).partitions == ()


def test_one_quiet_for_longer_than_three_beats_is_silent_and_has_no_rate() -> None:
    p = process_of(row(quiet_s=15.5), silent_after_s=15)
    assert (p.state, p.per_s) == ("silent", {})
    assert p.partitions == (0, 3)  # what it held when it went quiet (a frozen one still may)
    stopped = process_of(row(quiet_s=999, stopped_at=T0), silent_after_s=15)
    assert (stopped.state, stopped.partitions) == ("stopped", ())  # its locks went with it


def test_a_count_that_went_down_is_no_rate_and_a_first_beat_has_none() -> None:
    restarted = process_of(row(before='{"n.partition.1": 50}'), 15)
    assert "n.partition.1" not in restarted.per_s
    first = process_of(row(before="{}", before_at=None), 15)
    assert first.per_s == {}


def test_a_queue_shows_what_waits_who_consumes_and_how_long_it_would_take_to_drain() -> None:
    depths: dict[str, QueueDepth | None] = {"n.partition.1": QueueDepth(messages=40, consumers=1),
              "n.partition.2": QueueDepth(messages=7, consumers=0)}  # fmt: skip
    figures = health([row()], depths, TOPOLOGY, 15)
    by_name = {q.name: q for q in figures.queues}
    assert (by_name["n.partition.1"].per_s, by_name["n.partition.1"].drain_s) == (4.0, 10.0)
    assert by_name["n.partition.2"].drain_s is None  # waiting, and nothing drains it
    assert by_name["n.intake"].messages is None  # the broker did not say
    assert [q.name for q in figures.queues] == TOPOLOGY.all_queues()
    assert figures.silent == 0


def test_a_moment_says_utc_and_carries_its_exact_value() -> None:
    shown = when(datetime(2026, 12, 7, 12, 30, 5, 123456, tzinfo=UTC), ms=True)
    assert shown == (
        '<time datetime="2026-12-07T12:30:05.123+00:00" title="2026-12-07 12:30:05.123 UTC">'
        "2026-12-07 12:30:05.123 UTC</time>"
    )
    tokyo = datetime.fromisoformat("2026-12-07T21:30:05+09:00")
    assert "12:30:05 UTC" in when(tokyo)
    assert when("2026-12-07T12:30:05+00:00").startswith('<time datetime="2026-12-07T12:30:05')
    assert when("<b>not a moment</b>") == "&lt;b&gt;not a moment&lt;/b&gt;"
    assert when(None) == ""


def test_a_trace_url_must_be_http_and_name_the_trace(monkeypatch: pytest.MonkeyPatch) -> None:
    for bad in ("javascript:alert(1)//{trace_id}", "https://traces.example.com/",
                "https://x/{trace_id} y"):  # fmt: skip
        monkeypatch.setenv("SAGA_CONSOLE_TRACE_URL", bad)
        with pytest.raises(ConfigError, match="SAGA_CONSOLE_TRACE_URL"):
            ConsoleSettings.from_env()
    monkeypatch.setenv("SAGA_CONSOLE_TRACE_URL", "https://t.example.com/trace/{trace_id}")
    assert ConsoleSettings.from_env().trace_url.endswith("{trace_id}")
