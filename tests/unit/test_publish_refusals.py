"""What a failed publish means: a nack is "not now" (kept, sent again), a return or a missing
exchange is "never" (buried as a dead letter), anything else is the broker away (backoff)."""

from __future__ import annotations

import aiormq
import pamqp.commands
import pytest

from shared.bus import refused_for_now, unroutable

NACK = aiormq.exceptions.DeliveryError(None, pamqp.commands.Basic.Nack(delivery_tag=3))
RETURN = aiormq.exceptions.DeliveryError(
    None, pamqp.commands.Basic.Return(reply_code=312, reply_text="NO_ROUTE", exchange="x")
)
MISSING = aiormq.exceptions.ChannelNotFoundEntity("NOT_FOUND - no exchange 'x'")
AWAY = aiormq.exceptions.AMQPConnectionError("connection reset")


@pytest.mark.parametrize(
    ("error", "for_now", "never"),
    [(NACK, True, False), (RETURN, False, True), (MISSING, False, True), (AWAY, False, False)],
    ids=["nack", "return", "no-exchange", "broker-away"],
)
def test_each_refusal_is_told_apart(error: BaseException, for_now: bool, never: bool) -> None:
    assert (refused_for_now(error), unroutable(error)) == (for_now, never)
