"""The simulated broker's deliveries are what the project's consumers read: the codec decodes
them, ``saga_shared.transport.delivery`` settles them, the dead-letter ingester reads their
deaths."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from typing import Any

import pytest
from aio_pika.abc import AbstractIncomingMessage

from saga_app.sim.broker import Broker, FakeDelivery
from saga_app.sim.loop import EPOCH
from saga_coordinator.dead_letters import read_death
from saga_shared.errors import InvalidMessage, RetryLater
from saga_shared.model.messages import ActionDone
from saga_shared.transport.codec import (
    COMMANDS,
    PARTITION,
    check_order_header,
    decode_incoming,
    identify_incoming,
    message_to_amqp,
    order_header,
    to_amqp,
)
from saga_shared.transport.delivery import Acks, Outcome, deliver
from saga_shared.transport.patience import in_hand
from tests.unit.factories import start_named
from tests.unit.test_sim_broker import TOPOLOGY as T
from tests.unit.test_sim_broker import Recorder, simulate
from tests.unit.test_sim_broker_crash import hold

START = start_named("refund", {"sku": "S", "quantity": 1}, saga_id="s-1", order_id="o-7")
DONE = ActionDone(
    saga_id="s-1", order_id="o-7", action="inventory.reserve_stock", phase="forward", step=0,
    idempotency_key="s-1:inventory.reserve_stock", result={"reservation_id": "r-1"},
)  # fmt: skip


async def one_delivery(b: Broker, queue: str, exchange: str, key: str, out: Any) -> FakeDelivery:
    recorder = Recorder(hold)
    b.connect().consume(queue, recorder)
    await b.connect().publish(exchange, key, out, mandatory=True)
    await asyncio.sleep(1)
    return recorder.seen[0]


def test_the_codec_decodes_and_identifies_a_delivery_of_a_real_message() -> None:
    async def body(b: Broker) -> FakeDelivery:
        key = T.command_key(START.type, START.order_id)
        partition = T.partition_queue(int(T.partition_key(START.order_id)))
        return await one_delivery(b, partition, T.commands_exchange, key, message_to_amqp(START))

    delivery = simulate(body)
    assert isinstance(delivery, AbstractIncomingMessage)
    assert decode_incoming(delivery, COMMANDS, 100_000) == START
    identity = identify_incoming(delivery)
    assert (identity.message_id, identity.order_id, identity.saga_id) == (
        START.message_id, "o-7", "s-1",
    )  # fmt: skip
    assert identity.message_type == "saga.start" and identity.transport_id == START.message_id
    assert order_header(delivery) == "o-7"
    check_order_header(delivery, "o-7")
    with pytest.raises(InvalidMessage):
        check_order_header(delivery, "another-order")


def test_a_body_without_an_id_takes_the_amqp_message_id() -> None:
    raw = DONE.model_dump(mode="json")
    del raw["message_id"]
    encoded = to_amqp(
        json.dumps(raw).encode(),
        message_id="transport-1", message_type=DONE.type, order_id="o-7",
    )  # fmt: skip

    async def body(b: Broker) -> FakeDelivery:
        return await one_delivery(b, T.partition_queue(2), T.partitions_exchange, "2", encoded)

    decoded = decode_incoming(simulate(body), PARTITION, 100_000)
    assert isinstance(decoded, ActionDone)
    assert decoded.message_id == "transport-1" and decoded.result == DONE.result


def test_shared_delivery_requeues_a_retry_and_dead_letters_an_invalid_message() -> None:
    async def handler(delivery: AbstractIncomingMessage) -> None:
        if delivery.message_id == "retry" and not delivery.redelivered:
            raise RetryLater("the database is away")
        if delivery.message_id == "invalid":
            raise InvalidMessage("not a message")

    async def body(b: Broker) -> tuple[list[Outcome], list[str | None], object]:
        outcomes: list[Outcome] = []

        async def consume(delivery: FakeDelivery) -> None:
            outcomes.append(await deliver(delivery, handler))

        dead = Recorder()
        b.connect().consume(T.intake_queue, consume, prefetch=1)
        b.connect().consume(T.dead_letter_queue, dead)
        c = b.connect()
        for mid in ("retry", "invalid"):
            await c.publish(T.commands_exchange, "saga.start", to_amqp(
                b"{}", message_id=mid, message_type="saga.start", order_id="o"))  # fmt: skip
        await asyncio.sleep(1)
        return outcomes, dead.ids, dead.seen[0].headers["x-first-death-reason"]

    outcomes, dead, reason = simulate(body)
    assert outcomes == [Outcome.RETRY, Outcome.ACK, Outcome.DEAD_LETTER]
    assert dead == ["invalid"] and reason == "rejected"


def test_held_acks_go_as_one_ack_with_multiple() -> None:
    async def body(b: Broker) -> tuple[list[str], int]:
        recorder = Recorder(hold)
        b.connect().consume(T.intake_queue, recorder, prefetch=10)
        c = b.connect()
        for i in range(5):
            await c.publish(T.commands_exchange, "saga.start", to_amqp(
                b"{}", message_id=f"m-{i}", message_type="saga.start", order_id="o"))  # fmt: skip
        await asyncio.sleep(1)
        waiting = [True, True, True, True, False]
        acks = Acks(lambda: waiting.pop(0))
        for delivery in recorder.seen:
            await acks.settle(delivery, Outcome.ACK)
        return [e.detail for e in b.trace if e.kind == "ack"], b.unacked(T.intake_queue)

    acks, unacked = simulate(body)
    assert acks == ["ctag1.1 tag 5 multiple"] * 5 and unacked == 0


def test_process_rejects_without_requeue_and_in_hand_sees_a_closed_channel() -> None:
    async def body(b: Broker) -> tuple[bool, bool, int]:
        delivery = await one_delivery(b, T.action_queue("email"), T.actions_exchange, "email",
                                      message_to_amqp(DONE))  # fmt: skip
        open_before = in_hand([delivery])
        with pytest.raises(RuntimeError):
            async with delivery.process():
                raise RuntimeError("the handler failed")
        dead = b.depth(T.dead_letter_queue)
        b.queues[T.action_queue("email")].consumers[0].cancel()
        return open_before, in_hand([delivery]), dead

    assert simulate(body) == (True, False, 1)


def test_the_dead_letter_ingester_reads_the_death_the_broker_wrote() -> None:
    async def refuse(delivery: FakeDelivery, _: int) -> None:
        await delivery.reject(requeue=True)

    async def body(b: Broker) -> FakeDelivery:
        dead = Recorder(hold)
        b.connect().consume(T.partition_queue(3), Recorder(refuse))
        b.connect().consume(T.dead_letter_queue, dead)
        await asyncio.sleep(3600.7)  # the death's time is the broker's, in whole seconds
        await b.connect().publish(T.partitions_exchange, "3", message_to_amqp(DONE))
        await asyncio.sleep(1)
        return dead.seen[0]

    letter = simulate(body)
    death = read_death(dict(letter.headers), datetime(2030, 1, 1, tzinfo=UTC))
    assert (death.reason, death.queue, death.count) == ("delivery_limit", T.partition_queue(3), 1)
    assert (death.exchange, death.routing_key) == (T.partitions_exchange, "3")
    assert EPOCH < death.at <= datetime(2026, 1, 1, 1, 0, 1, tzinfo=UTC)
    assert death.at.microsecond == 0
