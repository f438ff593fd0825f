"""What this process's consumers received, per queue: the heartbeat reports it (the console's
throughput per queue), and Prometheus scrapes it as ``saga_queue_deliveries_total``."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from saga_shared.observability import metrics


class Flow:
    def __init__(self) -> None:
        self._delivered: Counter[str] = Counter()
        # Each queue's series, looked up once: this runs for every delivery.
        self._series: dict[str, Any] = {}

    def delivered(self, queue: str) -> None:
        self._delivered[queue] += 1
        series = self._series.get(queue)
        if series is None:
            series = self._series[queue] = metrics.DELIVERIES.labels(queue)
        series.inc()

    def counts(self, queues: Iterable[str]) -> dict[str, int]:
        """Deliveries so far of each of ``queues`` this process consumed at least once."""
        return {q: self._delivered[q] for q in queues if q in self._delivered}


FLOW = Flow()
