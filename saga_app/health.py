"""``python -m saga_app.health``: the container's health check. A process is healthy when its
``/metrics`` endpoint (``SAGA_METRICS_BIND``) answers and its event loop's heartbeat
(``saga_heartbeat_timestamp_seconds``) is recent: the endpoint is served by a thread, which
answers even while the loop is frozen, so an answer alone would not tell. Exit 0 if so, 1 with
the reason in one line if not."""

from __future__ import annotations

import os
import re
import sys
import time
import urllib.request

from saga_shared.config import parse_bind
from saga_shared.errors import SagaError
from saga_shared.observability.metrics import HEARTBEAT_EVERY_S

# Six missed beats: a loop that busy is as good as frozen for whoever waits on it.
SILENT_AFTER_S = 6 * HEARTBEAT_EVERY_S
_BEAT = re.compile(r"^saga_heartbeat_timestamp_seconds ([0-9.e+]+)$", re.M)


def probe(bind: str, timeout_s: float = 3.0, now: float | None = None) -> str | None:
    """None when ``bind``'s /metrics answers with a recent heartbeat, else why not."""
    host, port = parse_bind("SAGA_METRICS_BIND", bind)
    if host in ("", "0.0.0.0", "::"):  # noqa: S104 - listening on every address; ask locally
        host = "127.0.0.1"
    url = f"http://{host}:{port}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as answer:
            body = answer.read().decode("utf-8", "replace")
    except OSError as exc:
        return f"{url}: {exc}"
    beat = _BEAT.search(body)
    if beat is None or float(beat.group(1)) == 0:
        return f"{url}: no heartbeat (is this a saga process?)"
    silent = (time.time() if now is None else now) - float(beat.group(1))
    if silent > SILENT_AFTER_S:
        return f"{url}: the event loop has not run for {silent:.0f} s"
    return None


def main() -> None:
    bind = os.environ.get("SAGA_METRICS_BIND", "127.0.0.1:9464")
    if bind == "off":
        sys.exit("SAGA_METRICS_BIND=off: nothing to probe")
    try:
        problem = probe(bind)
    except SagaError as exc:  # a bad SAGA_METRICS_BIND: named in one line
        sys.exit(str(exc))
    if problem:
        sys.exit(problem)


if __name__ == "__main__":
    main()
