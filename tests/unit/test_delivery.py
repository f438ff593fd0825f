"""The one place deliveries are settled: what a handler's error means, and coalesced acks."""

from __future__ import annotations

from typing import Any, cast

from aio_pika.abc import AbstractIncomingMessage

from shared.delivery import Acks, Outcome, decide, deliver
from shared.errors import InvalidMessage, RetryLater


class Delivery:
    """Records how it was settled, as the broker would see it on the channel."""

    def __init__(self, tag: int, wire: list[tuple[str, int, bool]]) -> None:
        self.delivery_tag, self.wire = tag, wire
        self.message_id, self.type, self.routing_key = f"m{tag}", "t", "k"

    async def ack(self, multiple: bool = False) -> None:
        self.wire.append(("ack", self.delivery_tag, multiple))

    async def reject(self, requeue: bool = False) -> None:
        self.wire.append(("requeue" if requeue else "reject", self.delivery_tag, False))


def deliveries(n: int) -> tuple[list[AbstractIncomingMessage], list[tuple[str, int, bool]]]:
    wire: list[tuple[str, int, bool]] = []
    return [cast(AbstractIncomingMessage, Delivery(t, wire)) for t in range(1, n + 1)], wire


def test_errors_map_to_one_outcome_each() -> None:
    assert decide(None) is Outcome.ACK
    assert decide(InvalidMessage("bad")) is Outcome.DEAD_LETTER
    assert decide(RetryLater("later")) is Outcome.RETRY
    assert decide(RuntimeError("bug")) is Outcome.RETRY


async def test_acks_wait_while_more_is_in_hand_then_one_frame_covers_them() -> None:
    messages, wire = deliveries(4)
    left = [True, True, True, False]
    acks = Acks(lambda: left.pop(0))
    for m in messages:
        await acks.settle(m, Outcome.ACK)
    assert wire == [("ack", 4, True)]


async def test_an_ack_is_sent_at_once_when_nothing_waits() -> None:
    messages, wire = deliveries(2)
    acks = Acks(lambda: False)
    for m in messages:
        await acks.settle(m, Outcome.ACK)
    assert wire == [("ack", 1, False), ("ack", 2, False)]


async def test_held_acks_go_out_before_a_reject_so_it_settles_only_itself() -> None:
    messages, wire = deliveries(3)
    acks = Acks(lambda: True)
    await acks.settle(messages[0], Outcome.ACK)
    await acks.settle(messages[1], Outcome.ACK)
    await acks.settle(messages[2], Outcome.RETRY)
    assert wire == [("ack", 2, True), ("requeue", 3, False)]


async def test_no_more_than_most_acks_are_held() -> None:
    messages, wire = deliveries(5)
    acks = Acks(lambda: True, most=2)
    for m in messages:
        await acks.settle(m, Outcome.ACK)
    await acks.flush()
    assert wire == [("ack", 2, True), ("ack", 4, True), ("ack", 5, False)]


async def test_deliver_settles_through_the_coalescer_it_is_given() -> None:
    messages, wire = deliveries(2)
    acks = Acks(lambda: True)

    async def fine(_: Any) -> None:
        return None

    async def poison(_: Any) -> None:
        raise InvalidMessage("not JSON")

    assert await deliver(messages[0], fine, settle_with=acks.settle) is Outcome.ACK
    assert wire == []
    assert await deliver(messages[1], poison, settle_with=acks.settle) is Outcome.DEAD_LETTER
    assert wire == [("ack", 1, False), ("reject", 2, False)]
