"""How long a consumer the broker dropped waits before subscribing again
(``saga_shared.transport.consumer``)."""

from __future__ import annotations

import time
from collections.abc import Callable

from tenacity import RetryCallState


class Backoff:
    """How long to wait before subscribing again: 0.2 s, doubling up to 5 s while subscribing
    keeps failing (the broker away, the queue not declared again yet), and 0.2 s again after a
    subscription that ran for ``ran_s``. tenacity's own exponential wait counts every attempt
    of the consumer's life: a process that had lost its consumer five times waited 5 s after
    every later loss."""

    def __init__(self, ran_s: float = 5.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.ran_s = ran_s
        self.clock = clock
        self._since = clock()
        self._failed = 0  # subscriptions in a row that did not run for ``ran_s``

    def subscribing(self) -> None:
        self._since = self.clock()

    def __call__(self, _: RetryCallState) -> float:
        if self.clock() - self._since >= self.ran_s:
            self._failed = 0
        wait = min(0.2 * 2.0 ** min(self._failed, 5), 5.0)  # no overflow after hours away
        self._failed += 1
        return wait
