"""Makes the coordinator's handler raise for chosen sagas: a bug in the handler, as the broker
sees it (redeliveries, then the dead letters)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime

from saga_coordinator.processor import Processor
from saga_coordinator.rows import Claim
from saga_coordinator.store import Tx
from saga_shared.model.messages import PartitionMessage

Handle = Callable[[Processor, Tx, PartitionMessage, Claim, datetime], Awaitable[str]]


class Sabotage:
    """Makes the coordinator's handler raise for chosen sagas: a bug in the handler, as seen
    from the broker (redeliveries, then the dead letters)."""

    def __init__(self) -> None:
        self.fail_times: dict[str, int] = {}  # saga_id -> failures left (-1: always)
        self.raised: dict[str, int] = {}

    def always(self, saga_id: str) -> None:
        self.fail_times[saga_id] = -1

    def times(self, saga_id: str, count: int) -> None:
        self.fail_times[saga_id] = count

    def stop(self, saga_id: str) -> None:
        self.fail_times.pop(saga_id, None)

    def wrap(self, original: Handle) -> Handle:
        async def handle(
            self_: Processor, tx: Tx, message: PartitionMessage, claim: Claim, now: datetime
        ) -> str:
            left = self.fail_times.get(message.saga_id, 0)
            if left != 0 and message.type == "saga.start":
                self.fail_times[message.saga_id] = left - 1 if left > 0 else -1
                self.raised[message.saga_id] = self.raised.get(message.saga_id, 0) + 1
                raise RuntimeError(f"simulated handler bug on {message.saga_id}")
            return await original(self_, tx, message, claim, now)

        return handle
