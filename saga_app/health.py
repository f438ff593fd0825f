"""``python -m saga_app.health``: the container's health check. A process is healthy when its
``/metrics`` endpoint (``SAGA_METRICS_BIND``) answers; exit 0 if so, 1 with the reason if not."""

from __future__ import annotations

import os
import sys
import urllib.request

from saga_shared.config import parse_bind


def probe(bind: str, timeout_s: float = 3.0) -> str | None:
    """None when ``bind``'s /metrics answers 200, else why not."""
    host, port = parse_bind("SAGA_METRICS_BIND", bind)
    if host in ("", "0.0.0.0", "::"):  # noqa: S104 - listening on every address; ask locally
        host = "127.0.0.1"
    url = f"http://{host}:{port}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as answer:
            status = int(answer.status)
    except OSError as exc:
        return f"{url}: {exc}"
    return None if status == 200 else f"{url}: HTTP {status}"


def main() -> None:
    bind = os.environ.get("SAGA_METRICS_BIND", "127.0.0.1:9464")
    if bind == "off":
        sys.exit("SAGA_METRICS_BIND=off: nothing to probe")
    problem = probe(bind)
    if problem:
        sys.exit(problem)


if __name__ == "__main__":
    main()
