"""The simulated broker when things go away: consumers cancelled, processes dying, settling
mistakes, and the broker itself crashing and restarting."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aio_pika.exceptions import MessageProcessError

from saga_app.sim.broker import Broker, FakeDelivery
from saga_app.sim.errors import BrokerDown, ChannelGone, UnknownDeliveryTag
from saga_app.sim.loop import run
from tests.unit.test_sim_broker import TOPOLOGY as T
from tests.unit.test_sim_broker import Recorder, broker, message, publish_all, simulate


async def hold(delivery: FakeDelivery, _: int) -> None:
    """Settle nothing: the delivery stays in the consumer's hand."""


def test_only_the_oldest_consumer_receives_and_the_next_takes_over_in_order() -> None:
    async def body(b: Broker) -> tuple[list[str | None], list[FakeDelivery], list[str]]:
        active, standby = Recorder(hold), Recorder()
        told: list[str] = []
        first = b.connect().consume(T.partition_queue(0), active, prefetch=3)
        first.add_close_callback(told.append)
        b.connect().consume(T.partition_queue(0), standby, prefetch=3)
        await publish_all(b.connect(), T.partitions_exchange, "0", 5)
        await asyncio.sleep(1)
        first.cancel()
        await asyncio.sleep(1)
        return active.ids, standby.seen, told

    held, taken, told = simulate(body)
    assert held == ["m-0", "m-1", "m-2"]
    assert [d.message_id for d in taken] == ["m-0", "m-1", "m-2", "m-3", "m-4"]
    assert [d.redelivered for d in taken] == [True, True, True, False, False]
    assert [d.headers.get("x-delivery-count") for d in taken] == [1, 1, 1, None, None]
    assert told == ["cancelled"]


def test_a_dead_process_gives_back_what_it_held_and_can_settle_nothing_more() -> None:
    async def body(b: Broker) -> tuple[int, int, list[str]]:
        recorder = Recorder(hold)
        process = b.connect("coordinator")
        told: list[str] = []
        process.add_close_callback(told.append)
        process.consume(T.intake_queue, recorder, prefetch=2)
        await publish_all(b.connect(), T.commands_exchange, "saga.start", 3)
        await asyncio.sleep(1)
        process.close("killed")
        with pytest.raises(ChannelGone):
            await recorder.seen[0].ack()
        return b.depth(T.intake_queue), b.unacked(T.intake_queue), told

    assert simulate(body) == (3, 0, ["killed"])


def test_a_delivery_on_its_way_to_a_consumer_that_closed_is_given_back_unseen() -> None:
    async def body(b: Broker) -> tuple[int, int, int]:
        recorder = Recorder()
        await publish_all(b.connect(), T.commands_exchange, "saga.start", 1)
        consumer = b.connect().consume(T.intake_queue, recorder)
        consumer.cancel()  # before the delivery's hop is over
        await asyncio.sleep(1)
        requeued = [e for e in b.trace if e.kind == "requeue"]
        return len(recorder.seen), b.depth(T.intake_queue), len(requeued)

    assert simulate(body) == (0, 1, 1)


def test_an_ack_with_multiple_covers_the_tags_below_it() -> None:
    async def body(b: Broker) -> tuple[int, int]:
        recorder = Recorder(hold)
        b.connect().consume(T.intake_queue, recorder, prefetch=10)
        await publish_all(b.connect(), T.commands_exchange, "saga.start", 4)
        await asyncio.sleep(1)
        await recorder.seen[2].ack(multiple=True)
        return b.unacked(T.intake_queue), b.depth(T.intake_queue)

    assert simulate(body) == (1, 0)


def test_settling_a_tag_twice_is_refused_locally_or_closes_the_channel() -> None:
    async def body(b: Broker) -> tuple[int, int]:
        recorder = Recorder(hold)
        consumer = b.connect().consume(T.intake_queue, recorder, prefetch=10)
        await publish_all(b.connect(), T.commands_exchange, "saga.start", 4)
        await asyncio.sleep(1)
        first, second, third, _ = recorder.seen
        await second.ack(multiple=True)
        with pytest.raises(MessageProcessError):
            await second.ack()  # aio-pika refuses before sending anything
        with pytest.raises(UnknownDeliveryTag):
            await first.ack()  # covered by the multiple ack: the broker closes the channel
        assert consumer.closed
        with pytest.raises(ChannelGone):
            await third.ack()
        return b.depth(T.intake_queue), b.unacked(T.intake_queue)

    assert simulate(body) == (2, 0)


def test_a_callback_that_raises_is_recorded() -> None:
    async def broken(delivery: FakeDelivery, _: int) -> None:
        raise ValueError("a bug in the handler")

    async def body(b: Broker) -> list[BaseException]:
        b.connect().consume(T.intake_queue, Recorder(broken))
        await publish_all(b.connect(), T.commands_exchange, "saga.start", 1)
        await asyncio.sleep(1)
        return b.callback_errors

    [error] = simulate(body)
    assert isinstance(error, ValueError)


def test_an_exclusive_queue_goes_with_its_connection_and_a_deleted_queue_cancels() -> None:
    async def body(b: Broker) -> tuple[bool, list[str]]:
        client = b.connect("agent")
        b.declare_client_queue("replies", owner=client)
        told: list[str] = []
        b.connect().consume(T.action_queue("email"), Recorder()).add_close_callback(told.append)
        client.close()
        b.delete_queue(T.action_queue("email"))
        return "replies" in b.queues, told

    assert simulate(body) == (False, ["queue deleted"])


# --- the broker crashing ------------------------------------------------------------------
def test_a_crash_loses_what_was_on_its_way_and_keeps_what_it_committed() -> None:
    async def body(b: Broker) -> dict[str, Any]:
        publisher = b.connect("agent")
        committed = publisher.send(T.commands_exchange, "saga.start", message("committed"))
        await asyncio.sleep(0.0015)  # past its hop, before its confirm's
        on_its_way = publisher.send(T.commands_exchange, "saga.start", message("on-its-way"))
        b.crash()
        outcomes = await asyncio.gather(committed, on_its_way, return_exceptions=True)
        b.restart()
        await asyncio.sleep(1)  # long past the hop it would have arrived at
        lost = [e.message_id for e in b.trace if e.kind == "lost"]
        return {"outcomes": outcomes, "lost": lost, "depth": b.depth(T.intake_queue)}

    seen = run(body(broker(hop_s=(0.001, 0.001))))
    assert [type(o) for o in seen["outcomes"]] == [BrokerDown, BrokerDown]
    assert seen["lost"] == ["m-on-its-way"]
    assert seen["depth"] == 1  # the publisher will send it again: two of it, by design


def test_after_a_restart_durable_queues_keep_their_messages_and_processes_resubscribe() -> None:
    async def body(b: Broker) -> dict[str, Any]:
        held = Recorder(hold)
        process = b.connect("coordinator")
        process.consume(T.intake_queue, held, prefetch=2)
        b.declare_client_queue("replies", owner=b.connect("agent"))
        b.declare_client_queue("listener", durable=True)
        await publish_all(b.connect(), T.commands_exchange, "saga.start", 3)
        await asyncio.sleep(1)
        b.crash()
        b.restart()
        after = Recorder()
        b.connect("coordinator").consume(T.intake_queue, after)
        await asyncio.sleep(1)
        return {
            "closed": process.closed,
            "queues": ("replies" in b.queues, "listener" in b.queues),
            "ids": after.ids,
            "counts": [d.headers.get("x-delivery-count") for d in after.seen],
        }

    seen = simulate(body)
    assert seen["closed"] is True
    assert seen["queues"] == (False, True)
    assert seen["ids"] == ["m-0", "m-1", "m-2"]
    assert seen["counts"] == [1, 1, None]  # those in hand went back counted


def test_a_crash_drops_transient_messages_from_classic_queues_only() -> None:
    async def body(b: Broker) -> tuple[int, int]:
        b.declare_client_queue("listener", durable=True)
        c = b.connect()
        for i, mode in enumerate((1, 2, 1)):
            m = message(i)
            m.properties.delivery_mode = mode
            await c.publish("", "listener", m)
            await c.publish("", T.last_resort_queue, m)
        b.crash()
        return b.depth("listener"), b.depth(T.last_resort_queue)

    assert simulate(body) == (1, 3)


def lost_after_crash(seed: int, **config: Any) -> tuple[list[str | None], set[str | None]]:
    """What a crash lost, and which messages were committed within 1.5 s of it."""

    async def body(b: Broker) -> tuple[list[str | None], set[str | None]]:
        c = b.connect()
        for i in range(40):
            await c.publish(T.actions_exchange, "email", message(i))
            await asyncio.sleep(0.1)
        b.crash()
        crash = b.trace[-1].at
        recent = {e.message_id for e in b.trace if e.kind == "enqueue" and e.at >= crash - 1.5}
        return [e.message_id for e in b.trace if e.kind == "lost"], recent

    return run(body(broker(seed, **config)))


def test_by_default_a_crash_loses_nothing_confirmed() -> None:
    lost, recent = lost_after_crash(1)
    assert lost == [] and len(recent) > 10


def test_a_crash_may_lose_what_was_confirmed_within_its_window_and_only_that() -> None:
    lost, recent = lost_after_crash(1, loss_window_s=1.5, loss_probability=1.0)
    assert set(lost) == recent and 10 < len(recent) < 40
    some, _ = lost_after_crash(3, loss_window_s=1.5, loss_probability=0.5)
    assert 0 < len(some) < len(recent) and set(some) <= recent
    assert lost_after_crash(3, loss_window_s=1.5, loss_probability=0.5)[0] == some
