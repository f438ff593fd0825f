"""How long the next batch waits for company before it starts.

A batch (a group commit, an adapter's requests) pays fixed costs whatever its size: a statement
and its WAL flush, a confirm round, a socket write, an ack, a wake-up of each process it
touches. Under load, batches form by themselves from what arrives while the last one runs,
but at moderate load (64 sagas in flight) they stay small, and those fixed costs are most of
the CPU a saga costs. Waiting a little before the next batch lets more messages join it.

The wait follows the last batch: none after a batch of one (nothing else was in flight, as at
concurrency 1, where any wait would be pure latency), and otherwise the last batch's size times
``per_message_s``, at most ``most_s``: a small batch waits a little, since at low concurrency
few messages come in the meantime and the wait would mostly add latency. Nor does a batch wait
when enough is already waiting to fill it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from saga_shared.config import Settings


@dataclass(frozen=True)
class Linger:
    most_s: float = 0.0
    per_message_s: float = 0.0

    @classmethod
    def from_settings(cls, settings: Settings) -> Linger:
        return cls(settings.batch_linger_ms / 1000, settings.batch_linger_per_message_ms / 1000)

    def wait(self, last: int, waiting: int, most: int) -> float:
        """Seconds to wait before taking the next batch, given the size of the ``last`` one,
        how many messages are ``waiting`` already and the ``most`` a batch takes."""
        if last <= 1 or waiting >= most:
            return 0.0
        return min(self.most_s, last * self.per_message_s)


NEVER = Linger()  # no wait: each batch takes what has arrived
