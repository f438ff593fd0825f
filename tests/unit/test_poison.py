"""A request queue is classic: no delivery limit, no dead-lettering of its own. Its consumer
counts redeliveries (``saga_shared.transport.poison``) and buries with a confirm what it gives
up on, and the dead-letter ingester reads where and why it died; shown over the simulated
broker, whose request queue is declared from the same arguments as RabbitMQ's."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest

from saga_app.sim.broker import Broker, FakeDelivery
from saga_coordinator.dead_letters import read_death
from saga_shared.errors import DeliveryLimitReached, InvalidMessage
from saga_shared.transport.codec import TRANSIENT, message_to_amqp, to_amqp
from saga_shared.transport.delivery import InHand, Outcome, decide, deliver
from saga_shared.transport.poison import DEAD_HEADER, MemoryCounter, Poison
from tests.unit.test_sim_broker import TOPOLOGY as T
from tests.unit.test_sim_broker import Recorder, simulate
from tests.unit.test_sim_delivery import DONE

LIMIT = T.delivery_limit  # 3
QUEUE = T.request_queue("inventory")


class Publisher:
    """What the adapter's bus does for a burial: a mandatory publish, confirmed."""

    def __init__(self, b: Broker) -> None:
        self.connection = b.connect(user="saga-inventory")
        self.sent: list[tuple[str, str]] = []

    async def __call__(self, exchange: str, routing_key: str, message: Any) -> None:
        self.sent.append((exchange, routing_key))
        message.properties.user_id = "saga-inventory"
        await self.connection.publish(exchange, routing_key, message, mandatory=True)


def poison(b: Broker, counter: MemoryCounter) -> tuple[Poison, Publisher]:
    publisher = Publisher(b)
    return Poison(QUEUE, LIMIT, counter, publisher, T.dead_letter_exchange), publisher


async def consume(b: Broker, guard: Poison, handler: Any) -> None:
    """The adapter's consumer of its request queue: each delivery screened, then handled, then
    settled by the one rule (buried, not rejected, when it goes to the dead letters)."""
    in_hand = InHand(guard.bury)

    async def take(delivery: FakeDelivery) -> None:
        in_hand.add(delivery)
        await deliver(delivery, guard.screen(handler), settle_with=in_hand.settle)

    b.connect().consume(QUEUE, take)


async def send(b: Broker, body: bytes, message_id: str) -> None:
    """A request to the inventory's request queue, as the coordinator routes it."""
    request = to_amqp(body, message_id=message_id, message_type="action.request", order_id="o-1")
    await b.connect().publish(T.actions_exchange, T.request_key("inventory"), request,
                              mandatory=True)  # fmt: skip


def test_a_request_queue_is_classic_and_not_durable_and_a_request_is_transient() -> None:
    async def body(b: Broker) -> tuple[str, bool, int | None]:
        queue = b.queues[QUEUE]
        return queue.kind, queue.durable, queue.delivery_limit

    assert simulate(body) == ("classic", False, None)
    request = to_amqp(b"{}", message_id="r", message_type="action.request", order_id="o")
    assert request.properties.delivery_mode == TRANSIENT
    assert message_to_amqp(DONE).properties.delivery_mode == 2  # an outcome stays persistent


def test_a_request_that_keeps_failing_is_handled_limit_plus_one_times_then_buried() -> None:
    calls: list[int] = []

    async def body(b: Broker) -> tuple[list[FakeDelivery], Publisher]:
        counter = MemoryCounter()
        guard, publisher = poison(b, counter)

        async def broken(delivery: FakeDelivery) -> None:
            calls.append(1)
            raise RuntimeError("a bug in the service")

        letters = Recorder()
        b.connect().consume(T.dead_letter_queue, letters)
        await consume(b, guard, broken)
        await send(b, b"{}", "req-1")
        await asyncio.sleep(5)
        assert counter.counts == {(QUEUE, "req-1"): LIMIT + 2}
        return letters.seen, publisher

    letters, publisher = simulate(body)
    assert len(calls) == LIMIT + 1  # what a quorum queue with this limit allows
    [letter] = letters
    assert publisher.sent == [(T.dead_letter_exchange, "")]
    death = read_death(dict(letter.headers), datetime.now(UTC))
    assert (death.reason, death.queue, death.count) == ("delivery_limit", QUEUE, LIMIT + 1)
    assert (death.exchange, death.routing_key) == (T.actions_exchange, "request.inventory")
    assert letter.message_id == "req-1" and letter.body == b"{}"


def test_an_invalid_request_is_buried_at_once_naming_its_sender() -> None:
    async def body(b: Broker) -> list[FakeDelivery]:
        guard, _ = poison(b, MemoryCounter())

        async def refuse(delivery: FakeDelivery) -> None:
            raise InvalidMessage("body is not JSON")

        letters = Recorder()
        b.connect().consume(T.dead_letter_queue, letters)
        await consume(b, guard, refuse)
        coordinator = b.connect(user="saga-coordinator")
        garbage = to_amqp(b"{not json", message_id="g-1", message_type="action.request",
                          order_id="o-1")  # fmt: skip
        garbage.properties.user_id = "saga-coordinator"
        await coordinator.publish(T.actions_exchange, "request.inventory", garbage,
                                  mandatory=True)  # fmt: skip
        await asyncio.sleep(2)
        return letters.seen

    [letter] = simulate(body)
    death = read_death(dict(letter.headers), datetime.now(UTC))
    assert (death.reason, death.count) == ("rejected", 1)
    assert letter.body == b"{not json"
    assert letter.user_id == "saga-inventory"  # the broker stamps who buried it...
    assert letter.headers[DEAD_HEADER]["sender"] == "saga-coordinator"  # ...and who sent it


def test_a_first_delivery_is_never_counted() -> None:
    """Nothing is written for a request handled at its first delivery: the hot path costs
    no statement."""

    async def body(b: Broker) -> MemoryCounter:
        counter = MemoryCounter()
        guard, _ = poison(b, counter)

        async def fine(delivery: FakeDelivery) -> None:
            return None

        await consume(b, guard, fine)
        for i in range(20):
            request = to_amqp(b"{}", message_id=f"ok-{i}", message_type="action.request",
                              order_id="o-1")  # fmt: skip
            await b.connect().publish(T.actions_exchange, "request.inventory", request,
                                      mandatory=True)  # fmt: skip
        await asyncio.sleep(2)
        return counter

    assert simulate(body).counts == {}


def test_the_limit_is_a_dead_letter_outcome_and_logged_without_a_traceback() -> None:
    assert decide(DeliveryLimitReached(4, 3)) is Outcome.DEAD_LETTER
    assert "handled 4 times, over the delivery limit of 3" in str(DeliveryLimitReached(4, 3))


@pytest.mark.parametrize("queue", ["sim.partition.0", "sim.intake"])
def test_a_letter_the_broker_dead_lettered_is_read_as_before(queue: str) -> None:
    headers = {"x-first-death-reason": "delivery_limit", "x-first-death-queue": queue,
               "x-death": [{"queue": queue, "reason": "delivery_limit", "count": 4,
                            "exchange": "sim.partitions", "routing-keys": ["0"]}]}  # fmt: skip
    death = read_death(headers, datetime.now(UTC))
    assert (death.reason, death.queue, death.count, death.routing_key) == (
        "delivery_limit", queue, 4, "0",
    )  # fmt: skip


def test_a_burial_the_broker_refuses_puts_the_request_back_and_buries_it_next_time() -> None:
    class Refusing(Publisher):
        async def __call__(self, exchange: str, routing_key: str, message: Any) -> None:
            if not self.sent:
                self.sent.append(("refused", ""))
                raise ConnectionError("the dead letters' queue is without a majority")
            await super().__call__(exchange, routing_key, message)

    async def body(b: Broker) -> tuple[list[FakeDelivery], Publisher]:
        publisher = Refusing(b)
        guard = Poison(QUEUE, LIMIT, MemoryCounter(), publisher, T.dead_letter_exchange)

        async def refuse(delivery: FakeDelivery) -> None:
            raise InvalidMessage("body is not JSON")

        letters = Recorder()
        b.connect().consume(T.dead_letter_queue, letters)
        await consume(b, guard, refuse)
        await send(b, b"{no", "g-2")
        await asyncio.sleep(5)
        return letters.seen, publisher

    letters, publisher = simulate(body)
    assert publisher.sent == [("refused", ""), (T.dead_letter_exchange, "")]
    [letter] = letters  # kept, then buried once
    assert letter.message_id == "g-2" and letter.body == b"{no"
