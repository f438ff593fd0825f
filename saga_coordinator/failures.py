"""The failure hook every consumer passes to the bus: record the error, block the order."""

from __future__ import annotations

from aio_pika.abc import AbstractIncomingMessage

from saga_coordinator.store import Store
from shared.codec import identify_incoming
from shared.delivery import FailureHook, Outcome


def failure_recorder(store: Store, queue: str, *, block_order: bool) -> FailureHook:
    """Each failed attempt is stored with its error, so the dead letter can say why. Consumers
    of an order's convoy (intake, partitions) also block the order at the first failure: with a
    prefetch above one, later messages of the order are already in hand and would otherwise be
    handled before the failed one comes back."""

    async def on_failure(
        message: AbstractIncomingMessage, error: BaseException, outcome: Outcome
    ) -> None:
        ident = identify_incoming(message)
        state = "dead" if outcome is Outcome.DEAD_LETTER else "retrying"
        await store.record_failure(
            message_id=ident.message_id,
            order_id=ident.order_id,
            queue=queue,
            error=f"{type(error).__name__}: {error}",
            block=state if block_order else None,
        )

    return on_failure
