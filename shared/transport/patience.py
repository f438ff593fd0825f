"""Publishing what a delivery in hand owes, patiently. When the broker cannot take a publish
for now (a quorum queue without a majority nacks it; the connection is moving to another node),
requeueing the delivery would burn one of its delivery attempts per round trip: a ten-second
outage would send a perfectly good request to the dead letters. So the delivery stays in hand
and the publish is tried again with backoff for as long as the delivery's channel lives (once
it is gone the broker redelivers it anyway). Meanwhile the consumer's prefetch fills up and it
takes no more: back-pressure, not loss."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from aio_pika.abc import AbstractIncomingMessage
from aio_pika.exceptions import CONNECTION_EXCEPTIONS

from saga_shared.transport.bus import Bus, Item, refused_for_now, unroutable

log = logging.getLogger(__name__)


def worth_waiting(error: BaseException) -> bool:
    """The broker may take it later: a nack, the connection away, no confirm in time. Not a
    return: an unroutable message stays unroutable (a configuration error, for the delivery
    limit and the dead letters)."""
    if refused_for_now(error):
        return True
    away = isinstance(error, (*CONNECTION_EXCEPTIONS, TimeoutError))
    return away and not unroutable(error)


def in_hand(deliveries: Sequence[AbstractIncomingMessage]) -> bool:
    """Whether the deliveries can still be settled: their channel is open."""
    return all(not d.channel.is_closed for d in deliveries)


async def publish_in_hand(
    bus: Bus,
    items: Sequence[Item],
    deliveries: Sequence[AbstractIncomingMessage],
    *,
    first_wait_s: float = 0.05,
    most_wait_s: float = 5.0,
    local: Sequence[bool] = (),
) -> list[BaseException | None]:
    """``bus.publish_many``, with the items the broker cannot take for now published again
    (in their order) until they are confirmed or ``deliveries`` can no longer be settled;
    ``local``: per item, whether a consumer of this process may take it instead."""
    results: list[BaseException | None] = [None] * len(items)
    pending = list(range(len(items)))
    wait = first_wait_s
    while pending:
        try:
            errors = await bus.publish_many(
                [items[i] for i in pending], local=[local[i] for i in pending] if local else ()
            )
        except Exception as exc:  # the channel could not even be opened
            errors = [exc] * len(pending)
        for i, error in zip(pending, errors, strict=True):
            results[i] = error
        pending = [i for i in pending if (e := results[i]) is not None and worth_waiting(e)]
        if not pending or not in_hand(deliveries):
            break
        first = results[pending[0]]
        log.warning("the broker cannot take %d publishes for now (%r)", len(pending), first)
        await asyncio.sleep(wait)
        wait = min(wait * 2, most_wait_s)
    return results
