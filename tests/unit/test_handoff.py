"""The in-process hand-off (``saga_shared.transport.handoff``): which publishes it takes, how a
delivery handed over settles, and what a stopping consumer does with those it had not started."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import cast

import pamqp.commands
import pytest
from aio_pika.abc import AbstractIncomingMessage
from aiormq.exceptions import ChannelInvalidStateError

from saga_shared.config import Settings
from saga_shared.transport.bus import Bus
from saga_shared.transport.codec import Outgoing
from saga_shared.transport.consumer import _Subscription
from saga_shared.transport.delivery import Acks, BatchVerdict, Outcome
from saga_shared.transport.handoff import Handoff, LocalDelivery
from saga_shared.transport.linger import Linger
from saga_shared.transport.topology import Topology
from tests.unit.test_delivery import Delivery

TOPOLOGY = Topology("ns", 4, 5, declared_services=("inventory", "erp"))
Sent = list[tuple[str, str, bytes]]


def handoff() -> tuple[Handoff, Sent]:
    sent: Sent = []

    async def away(exchange: str, routing_key: str, message: Outgoing) -> None:
        sent.append((exchange, routing_key, message.body))

    return Handoff(TOPOLOGY, away), sent


def outgoing(body: bytes = b"{}", message_id: str = "m1") -> Outgoing:
    return Outgoing(body, pamqp.commands.Basic.Properties(
        message_id=message_id, message_type="action.request", headers={"x-order-id": "o1"},
    ))  # fmt: skip


def test_only_requests_and_outcomes_reach_a_queue_of_the_hand_off() -> None:
    h, _ = handoff()
    assert h.queue_of("ns.actions", "request.erp") == "ns.request.erp"
    assert h.queue_of("ns.outcomes", "3") == "ns.outcome.3"
    assert h.queue_of("ns.outcomes", "4") is None  # no such partition
    assert h.queue_of("ns.outcomes", "x") is None
    assert h.queue_of("ns.actions", "settle.erp") is None  # a settle: a quorum queue's
    assert h.queue_of("ns.partitions", "3") is None  # commands, settle answers
    assert h.queue_of("ns.commands", "saga.start.3") is None
    assert h.attach("ns.partition.3", "tag", lambda d: None) is None  # a quorum queue


def test_a_publish_is_handed_over_while_its_queue_is_taken_here_and_not_after() -> None:
    h, _ = handoff()
    taken: list[LocalDelivery] = []
    assert not h.take("ns.actions", "request.erp", outgoing(), "guest")  # nobody here yet
    taker = h.attach("ns.request.erp", "ctag-7", taken.append)
    assert taker is not None
    assert h.take("ns.actions", "request.erp", outgoing(b'{"a": 1}'), "guest")
    [delivery] = taken
    assert (delivery.body, delivery.message_id, delivery.user_id) == (b'{"a": 1}', "m1", "guest")
    assert (delivery.exchange, delivery.routing_key) == ("ns.actions", "request.erp")
    assert delivery.consumer_tag == "ctag-7" and not delivery.redelivered
    assert delivery.headers == {"x-order-id": "o1"}
    assert not delivery.channel.is_closed
    taker.close()
    with pytest.raises(ChannelInvalidStateError):  # as a broker's delivery on a closed channel
        delivery.channel  # noqa: B018 (its consumer stopped: it can no longer be settled here)
    assert not h.take("ns.actions", "request.erp", outgoing(), "guest")
    assert len(taken) == 1


async def test_an_ack_ends_it_and_anything_else_sends_it_the_brokers_way_once() -> None:
    h, sent = handoff()
    taken: list[LocalDelivery] = []
    h.attach("ns.outcome.2", "tag", taken.append)
    for _ in range(3):
        h.take("ns.outcomes", "2", outgoing(b"x"), "guest")
    acked, retried, buried = taken
    await acked.ack()
    await acked.reject(requeue=True)  # settled already: nothing more
    await retried.reject(requeue=True)
    await retried.nack()
    await buried.reject(requeue=False)
    assert sent == [("ns.outcomes", "2", b"x"), ("ns.outcomes", "2", b"x")]
    assert acked.processed and retried.processed and buried.processed


async def test_a_held_broker_ack_is_sent_when_a_delivery_handed_over_ends_the_run() -> None:
    """A delivery handed over never carries the broker's ack: the broker's held before it goes
    out when nothing else waits, and a multiple ack is never sent on its behalf."""
    wire: list[tuple[str, int, bool]] = []
    broker = [cast(AbstractIncomingMessage, Delivery(t, wire)) for t in (1, 2)]
    h, _ = handoff()
    taken: list[LocalDelivery] = []
    h.attach("ns.outcome.0", "tag", taken.append)
    h.take("ns.outcomes", "0", outgoing(), "guest")
    left = [True, True, False]
    acks = Acks(lambda: left.pop(0))
    await acks.settle(broker[0], Outcome.ACK)
    await acks.settle(broker[1], Outcome.ACK)
    await acks.settle(taken[0], Outcome.ACK)
    assert wire == [("ack", 2, True)]
    assert taken[0].processed


async def test_a_stopping_consumer_sends_what_was_handed_over_and_not_started_the_brokers_way() -> (
    None
):
    """The deliveries handed over and waiting (not started) go the broker's way, in order; the
    broker's own are left for the channel's close to return."""
    wire: list[tuple[str, int, bool]] = []
    h, sent = handoff()
    bus = cast(Bus, type("FakeBus", (), {"settings": Settings(), "handoff": h})())

    async def handler(delivery: AbstractIncomingMessage) -> None:
        raise AssertionError("nothing is started")

    sub = _Subscription(bus, "ns.partition.1", handler, 8, "sequential", None, None)
    h.attach("ns.outcome.1", "tag", sub.take_here)
    h.take("ns.outcomes", "1", outgoing(b"first"), "guest")
    sub.inbox.put_nowait(cast(AbstractIncomingMessage, Delivery(1, wire)))
    h.take("ns.outcomes", "1", outgoing(b"second"), "guest")
    sub.carried.append(sub.inbox.get_nowait())  # the head of the next batch, taken
    await sub._hand_back()
    assert sent == [("ns.outcomes", "1", b"first"), ("ns.outcomes", "1", b"second")]
    assert wire == [] and sub.inbox.empty() and not sub.carried


async def test_a_batch_taken_and_waiting_for_company_at_a_stop_goes_the_brokers_way() -> None:
    """An adapter's batch lingers for more requests: one handed over and taken into it, not
    started, is not lost when the consumer stops (a broker's goes back when the channel closes)."""
    h, sent = handoff()
    bus = cast(Bus, type("FakeBus", (), {"settings": Settings(), "handoff": h})())

    class Lingering:
        def wait(self, last: int, waiting: int, most: int) -> float:
            return 10.0

    async def batch(messages: Sequence[AbstractIncomingMessage]) -> list[BatchVerdict]:
        raise AssertionError("nothing is started")

    sub = _Subscription(bus, "ns.request.erp", batch_handler_never, 8, "concurrent", None, batch,
                        cast(Linger, Lingering()))  # fmt: skip
    h.attach("ns.request.erp", "tag", sub.take_here)
    worker = asyncio.create_task(sub.batches(batch, 8))
    h.take("ns.actions", "request.erp", outgoing(b"lingering"), "guest")
    await asyncio.sleep(0.01)
    assert sub.inbox.empty()  # taken into the batch, which waits
    worker.cancel()
    await asyncio.gather(worker, return_exceptions=True)
    await sub._hand_back()
    assert sent == [("ns.actions", "request.erp", b"lingering")]


async def batch_handler_never(delivery: AbstractIncomingMessage) -> None:
    raise AssertionError("nothing is started")


async def test_one_the_broker_cannot_take_back_is_left_to_its_deadline_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Lost as a classic queue's message is lost with its node: the settle does not fail (the
    consumer goes on), and the log says what became of it."""

    async def away(exchange: str, routing_key: str, message: Outgoing) -> None:
        raise ConnectionError("the broker is away")

    h = Handoff(TOPOLOGY, away)
    taken: list[LocalDelivery] = []
    h.attach("ns.request.erp", "tag", taken.append)
    h.take("ns.actions", "request.erp", outgoing(), "guest")
    await taken[0].reject(requeue=True)
    assert taken[0].processed
    assert "m1 (action.request) could not go the broker's way" in caplog.text
    assert "its step's deadline sends the request again" in caplog.text
