"""Token buckets: at most ``rate`` events a second per key, with bursts of ``burst``."""

from __future__ import annotations

import time
from collections.abc import Callable


class TokenBuckets:
    # Buckets of keys not seen for a while are full again; dropping them loses nothing, and
    # keeps the memory bounded whatever the number of keys.
    MAX_KEYS = 10_000

    def __init__(
        self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate = rate
        self.burst = float(burst)
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, when)

    def allow(self, key: str) -> bool:
        now = self._clock()
        tokens, when = self._buckets.get(key, (self.burst, now))
        tokens = min(self.burst, tokens + (now - when) * self.rate)
        allowed = tokens >= 1.0
        self._buckets[key] = (tokens - 1.0 if allowed else tokens, now)
        if len(self._buckets) > self.MAX_KEYS:
            self._forget_full(now)
        return allowed

    def _forget_full(self, now: float) -> None:
        full_after = self.burst / self.rate
        self._buckets = {k: v for k, v in self._buckets.items() if now - v[1] < full_after}
