"""The one place deliveries are settled: what a handler's error means, and coalesced acks."""

from __future__ import annotations

from typing import Any, cast

from aio_pika.abc import AbstractIncomingMessage

from saga_shared.errors import InvalidMessage, RetryLater
from saga_shared.transport.delivery import (
    Acks,
    Alone,
    BatchVerdict,
    InHand,
    Outcome,
    decide,
    deliver,
    deliver_batch,
)


class Delivery:
    """Records how it was settled, as the broker would see it on the channel."""

    def __init__(self, tag: int, wire: list[tuple[str, int, bool]]) -> None:
        self.delivery_tag, self.wire = tag, wire
        self.message_id, self.type, self.routing_key = f"m{tag}", "t", "k"
        self.headers: dict[str, object] = {"x-order-id": f"o{tag}"}

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


# --- batches --------------------------------------------------------------------------------


def held(messages: list[AbstractIncomingMessage]) -> InHand:
    in_hand = InHand()
    for m in messages:
        in_hand.add(m)
    return in_hand


async def test_a_batch_is_acked_in_one_frame_and_its_failures_alone() -> None:
    messages, wire = deliveries(4)
    told: list[str] = []

    async def batch(_: Any) -> list[BatchVerdict]:
        return [None, RetryLater("later"), None, InvalidMessage("bad")]

    async def hook(message: AbstractIncomingMessage, exc: BaseException, out: Outcome) -> None:
        told.append(f"{message.message_id}:{out.value}")

    await deliver_batch(messages, batch, held(messages), lambda *_: None, hook)
    assert wire == [("requeue", 2, False), ("reject", 4, False), ("ack", 3, True)]
    assert told == ["m2:retry", "m4:dead_letter"]


async def test_no_multiple_ack_over_a_delivery_still_in_hand_below() -> None:
    messages, wire = deliveries(3)
    in_hand = held(messages)  # m1 is being retried alone

    async def batch(_: Any) -> list[BatchVerdict]:
        return [None, None]

    await deliver_batch(messages[1:], batch, in_hand, lambda *_: None)
    assert wire == [("ack", 2, False), ("ack", 3, False)]
    await in_hand.settle(messages[0], Outcome.ACK)
    assert wire[-1] == ("ack", 1, False)


async def test_what_a_batch_cannot_finish_is_handed_on_alone() -> None:
    messages, wire = deliveries(2)
    spawned: list[tuple[str | None, object]] = []

    async def own(_: Any) -> None:
        return None

    async def batch(_: Any) -> list[BatchVerdict]:
        return [Alone(), Alone(own)]

    await deliver_batch(
        messages, batch, held(messages), lambda m, h: spawned.append((m.message_id, h))
    )
    assert spawned == [("m1", None), ("m2", own)]
    assert wire == []  # settled by whoever finishes them


async def test_a_batch_handler_that_breaks_fails_each_delivery_alike() -> None:
    messages, wire = deliveries(2)

    async def raises(_: Any) -> list[BatchVerdict]:
        raise RuntimeError("bug")

    async def short(_: Any) -> list[BatchVerdict]:
        return [None]

    await deliver_batch(messages, raises, held(messages), lambda *_: None)
    assert wire == [("requeue", 1, False), ("requeue", 2, False)]
    wire.clear()
    await deliver_batch(messages, short, held(messages), lambda *_: None)
    assert wire == [("requeue", 1, False), ("requeue", 2, False)]
