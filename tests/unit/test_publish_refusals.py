"""What a failed publish means: a nack is "not now" (kept, sent again), a return or a missing
exchange is "never" (buried as a dead letter), anything else is the broker away (backoff). A
delivery whose outcome the broker cannot take for now stays in hand while it is published
again."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

import aio_pika
import aiormq
import pamqp.commands
import pytest
from aio_pika.abc import AbstractIncomingMessage

from saga_shared.config import Settings
from saga_shared.transport.bus import Bus, Item, refused_for_now, unroutable
from saga_shared.transport.patience import publish_in_hand, worth_waiting

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


@pytest.mark.parametrize(
    ("error", "wait"),
    [(NACK, True), (AWAY, True), (TimeoutError(), True), (RETURN, False), (MISSING, False)],
    ids=["nack", "broker-away", "no-confirm-in-time", "return", "no-exchange"],
)
def test_a_delivery_in_hand_waits_for_what_may_work_later(error: BaseException, wait: bool) -> None:
    assert worth_waiting(error) is wait


class Refusing:
    """A bus whose broker answers each round with the next list of errors (None: confirmed)."""

    def __init__(self, *rounds: list[BaseException | None]) -> None:
        self.rounds = list(rounds)
        self.sent: list[list[str]] = []

    async def publish_many(
        self, items: Sequence[Item], *, local: Sequence[bool] = ()
    ) -> list[BaseException | None]:
        self.sent.append([key for _, key, _ in items])
        errors = self.rounds.pop(0)
        assert len(errors) == len(items)
        return errors


@dataclass
class Channel:
    is_closed: bool = False


@dataclass
class Delivery:
    channel: Channel = field(default_factory=Channel)


def items(*keys: str) -> list[Item]:
    return [("x", key, aio_pika.Message(b"{}")) for key in keys]


async def publish(bus: Refusing, keys: list[str], deliveries: list[Delivery]) -> list[object]:
    fake_bus, fake_deliveries = cast(Bus, bus), cast(list[AbstractIncomingMessage], deliveries)
    return list(await publish_in_hand(fake_bus, items(*keys), fake_deliveries, first_wait_s=0))


async def test_what_the_broker_refused_for_now_is_published_again_in_order() -> None:
    bus = Refusing([None, NACK, AWAY, None], [NACK, None], [None])
    assert await publish(bus, ["a", "b", "c", "d"], [Delivery()]) == [None] * 4
    assert bus.sent == [["a", "b", "c", "d"], ["b", "c"], ["b"]]


async def test_a_return_is_not_published_again() -> None:
    bus = Refusing([RETURN, NACK], [None])
    assert await publish(bus, ["a", "b"], [Delivery()]) == [RETURN, None]
    assert bus.sent == [["a", "b"], ["b"]]


async def test_it_gives_up_once_the_delivery_cannot_be_settled() -> None:
    """The broker redelivers a delivery whose channel closed: waiting for it is pointless."""
    delivery = Delivery()
    delivery.channel.is_closed = True
    bus = Refusing([NACK])
    assert await publish(bus, ["a"], [delivery]) == [NACK]


class FakeChannel:
    def __init__(self) -> None:
        self.closed = False

    async def close(self) -> None:
        self.closed = True


class FakeConnection:
    async def channel(self, **_: object) -> FakeChannel:
        return FakeChannel()


@pytest.mark.parametrize("which", ["_publisher", "_apart"])
async def test_a_nacking_channel_is_left_for_a_new_one_and_a_return_keeps_it(which: str) -> None:
    # RabbitMQ 3.10 keeps nacking every later publish of a channel once it nacked one: the
    # batch's channel and the channel of publishes apart follow one rule (``_after_refusal``).
    bus = Bus(Settings())
    bus._connection = FakeConnection()  # type: ignore[assignment]
    kept = FakeChannel()
    setattr(bus, which, kept)
    await bus._after_refusal(kept, [None, RETURN])  # type: ignore[arg-type]
    assert getattr(bus, which) is kept and not kept.closed

    await bus._after_refusal(kept, [None, NACK])
    assert kept.closed
    now = getattr(bus, which)
    # The batch's channel is opened again at once; the one apart by the next publish apart.
    assert (
        (isinstance(now, FakeChannel) and now is not kept) if which == "_publisher" else now is None
    )
    await bus._after_refusal(kept, [NACK])
    assert getattr(bus, which) is now
