"""What this process's consumers received, per queue: the heartbeat reports it (the console's
throughput per queue), and Prometheus scrapes it as ``saga_queue_deliveries_total``."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from saga_shared.observability import metrics


class Flow:
    def __init__(self) -> None:
        self._delivered: Counter[str] = Counter()

    def delivered(self, queue: str) -> None:
        self._delivered[queue] += 1
        metrics.DELIVERIES.labels(queue).inc()

    def counts(self, queues: Iterable[str]) -> dict[str, int]:
        """Deliveries so far of each of ``queues`` this process consumed at least once."""
        return {q: self._delivered[q] for q in queues if q in self._delivered}


FLOW = Flow()
