"""A sequential consumer that hands in several deliveries at once (the coordinator's partitions):
which ones go together, and how they are settled."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import cast

import pytest
from aio_pika.abc import AbstractIncomingMessage
from aiormq.exceptions import ChannelInvalidStateError

from saga_shared.config import Settings
from saga_shared.errors import RetryLater
from saga_shared.transport.bus import Bus
from saga_shared.transport.consumer import _Subscription
from saga_shared.transport.delivery import BatchVerdict
from saga_shared.transport.linger import Linger
from tests.unit.test_delivery import Delivery


def header_key(delivery: AbstractIncomingMessage) -> str | None:
    value = (delivery.headers or {}).get("x-order-id")
    return value if isinstance(value, str) else None


async def handled_together(
    orders: list[str | None], bad: str = "", depth: int = 1
) -> tuple[list[list[str]], list[tuple[str, int, bool]]]:
    """Queue deliveries for ``orders`` (None: no order header), let the consumer take them,
    and say which ran side by side and what went on the wire."""
    wire: list[tuple[str, int, bool]] = []
    bus = cast(Bus, type("FakeBus", (), {"settings": Settings()})())
    groups: list[list[str]] = []
    running: list[str] = []
    handled: list[str] = []
    all_handled = asyncio.Event()

    async def handler(delivery: AbstractIncomingMessage) -> None:
        if not running:
            groups.append([])
        running.append(delivery.message_id or "")
        groups[-1].append(delivery.message_id or "")
        await asyncio.sleep(0)  # the others of its group start meanwhile
        running.remove(delivery.message_id or "")
        handled.append(delivery.message_id or "")
        if len(handled) == len(orders):
            all_handled.set()
        if delivery.message_id == bad:
            raise RetryLater("not now")

    sub = _Subscription(
        bus, "q", handler, prefetch=64, mode="sequential", on_failure=None, batch=None
    )
    for tag, order in enumerate(orders, start=1):
        delivery = Delivery(tag, wire)
        delivery.headers = {} if order is None else {"x-order-id": order}
        sub.inbox.put_nowait(cast(AbstractIncomingMessage, delivery))
    worker = asyncio.create_task(sub.side_by_side(header_key, most=3, depth=depth))
    await asyncio.wait_for(all_handled.wait(), 5)
    await asyncio.wait_for(asyncio.gather(*sub.in_hand), 5)  # settled
    worker.cancel()
    return groups, wire


async def test_deliveries_of_distinct_orders_at_the_head_go_together_up_to_the_most() -> None:
    groups, wire = await handled_together(["a", "b", "c", "d", "e"])
    assert groups == [["m1", "m2", "m3"], ["m4", "m5"]]
    # one ack frame for all: more was waiting when the first group was settled
    assert wire == [("ack", 5, True)]


async def test_a_second_delivery_of_one_order_waits_for_the_first_to_be_settled() -> None:
    groups, _ = await handled_together(["a", "b", "a", "c"])
    assert groups == [["m1", "m2"], ["m3", "m4"]]


async def test_a_delivery_without_an_order_goes_alone() -> None:
    groups, _ = await handled_together(["a", None, "b"])
    assert groups == [["m1"], ["m2"], ["m3"]]


async def test_a_group_is_settled_in_queue_order_a_failure_on_its_own() -> None:
    _, wire = await handled_together(["a", "b", "c"], bad="m2")
    assert wire == [("ack", 1, False), ("requeue", 2, False), ("ack", 3, False)]


class Gated:
    """A partition consumer whose handler holds each delivery until the test releases it, and
    a log of what started, failed and went on the wire, in the order it happened."""

    def __init__(self, orders: list[str | None], depth: int, bad: str = "") -> None:
        self.events: list[str] = []
        self.release: dict[str, asyncio.Event] = {}
        self.wire = Wire(self.events)
        bus = cast(Bus, type("FakeBus", (), {"settings": Settings()})())

        async def handler(delivery: AbstractIncomingMessage) -> None:
            mid = delivery.message_id or ""
            self.events.append(f"start {mid}")
            await self.release.setdefault(mid, asyncio.Event()).wait()
            if mid == bad:
                raise RetryLater("not now")

        async def failed(delivery: AbstractIncomingMessage, exc: BaseException, _: object) -> None:
            await asyncio.sleep(0.01)  # recording a failure takes a round trip
            self.events.append(f"failure of {delivery.message_id} recorded")

        self.sub = _Subscription(
            bus, "q", handler, prefetch=64, mode="sequential", on_failure=failed, batch=None
        )
        for tag, order in enumerate(orders, start=1):
            delivery = Delivery(tag, self.wire)
            delivery.headers = {} if order is None else {"x-order-id": order}
            self.sub.inbox.put_nowait(cast(AbstractIncomingMessage, delivery))
        self.worker = asyncio.create_task(self.sub.side_by_side(header_key, 2, depth))

    async def let_go(self, *mids: str) -> None:
        for mid in mids:
            self.release.setdefault(mid, asyncio.Event()).set()
        for _ in range(20):  # let everything that can run, run
            await asyncio.sleep(0)

    def started(self) -> list[str]:
        return [e.removeprefix("start ") for e in self.events if e.startswith("start ")]

    async def close(self) -> None:
        await self.let_go(*(f"m{t}" for t in range(1, 20)))
        await asyncio.wait_for(asyncio.gather(*self.sub.in_hand, return_exceptions=True), 5)
        self.worker.cancel()


class Wire(list[tuple[str, int, bool]]):
    """The wire, also written into the shared event log."""

    def __init__(self, events: list[str]) -> None:
        super().__init__()
        self.events = events

    def append(self, item: tuple[str, int, bool]) -> None:
        super().append(item)
        self.events.append(f"{item[0]} {item[1]}")


async def test_with_depth_two_the_next_batch_is_handed_in_while_the_first_runs() -> None:
    gated = Gated(["a", "b", "c", "d", "e", "f"], depth=2)
    await gated.let_go()
    assert gated.started() == ["m1", "m2", "m3", "m4"]  # two batches of two, none settled
    await gated.let_go("m3", "m4")
    assert gated.wire == [], "the second batch settled before the first"
    assert gated.started() == ["m1", "m2", "m3", "m4"], "a third batch while two are in hand"
    await gated.let_go("m1", "m2")
    assert gated.started() == ["m1", "m2", "m3", "m4", "m5", "m6"]
    await gated.close()
    assert gated.wire == [("ack", 6, True)]  # in queue order, one frame


async def test_with_depth_two_a_delivery_of_an_order_in_hand_waits_and_so_does_what_follows() -> (
    None
):
    gated = Gated(["a", "b", "a", "c"], depth=2)
    await gated.let_go()
    assert gated.started() == ["m1", "m2"]
    await gated.let_go("m1")
    assert gated.started() == ["m1", "m2"], "m3 started before m1 was settled"
    await gated.let_go("m2")
    assert gated.started() == ["m1", "m2", "m3", "m4"]
    await gated.close()


async def test_with_depth_two_a_failure_is_recorded_before_its_orders_next_delivery_starts() -> (
    None
):
    gated = Gated(["a", "b", "a"], depth=2, bad="m1")
    await gated.let_go("m1", "m2")
    await asyncio.sleep(0.05)
    await gated.close()
    assert gated.events.index("failure of m1 recorded") < gated.events.index("start m3")
    assert gated.events.index("requeue 1") < gated.events.index("start m3")
    # m2's ack waits for m3's, which covers it: m3 was in hand, waiting for m1
    assert gated.wire == [("requeue", 1, False), ("ack", 3, True)]


async def test_with_depth_two_a_delivery_without_an_order_waits_for_all_and_all_for_it() -> None:
    gated = Gated(["a", None, "b"], depth=2)
    await gated.let_go()
    assert gated.started() == ["m1"]
    await gated.let_go("m1")
    assert gated.started() == ["m1", "m2"]
    await gated.let_go("m3")
    assert gated.started() == ["m1", "m2"]
    await gated.let_go("m2")
    assert gated.started() == ["m1", "m2", "m3"]
    await gated.close()


async def test_with_depth_three_three_batches_in_hand_settle_in_queue_order() -> None:
    gated = Gated(["a", "b", "c", "d", "e", "f", "g", "h"], depth=3)
    await gated.let_go()
    assert gated.started() == ["m1", "m2", "m3", "m4", "m5", "m6"]
    await gated.let_go("m5", "m6", "m3", "m4")
    assert gated.wire == [], "a later batch settled before the first"
    assert len(gated.started()) == 6, "a fourth batch while three are in hand"
    await gated.let_go("m1", "m2")
    assert gated.started() == [f"m{t}" for t in range(1, 9)]
    await gated.close()
    assert gated.wire == [("ack", 8, True)]


async def test_with_depth_three_an_order_in_any_batch_in_hand_holds_its_next_delivery() -> None:
    gated = Gated(["a", "b", "c", "d", "a", "e"], depth=3)
    await gated.let_go()
    assert gated.started() == ["m1", "m2", "m3", "m4"], "m5 started while m1 is in hand"
    await gated.let_go("m3", "m4")
    assert gated.started() == ["m1", "m2", "m3", "m4"]
    await gated.let_go("m1", "m2")
    assert gated.started() == ["m1", "m2", "m3", "m4", "m5", "m6"]
    await gated.close()


class ClosedChannel(Delivery):
    async def ack(self, multiple: bool = False) -> None:
        raise ChannelInvalidStateError()


async def test_a_delivery_whose_consumer_was_cancelled_reports_a_failed_settle_in_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The channel closed under a delivery in hand: its ack fails after the consumer's loop
    was cancelled, so nobody awaits it. The error is logged once, not left to asyncio's
    "Task exception was never retrieved" with a traceback (seen in a chaos run)."""
    bus = cast(Bus, type("FakeBus", (), {"settings": Settings()})())

    async def handler(delivery: AbstractIncomingMessage) -> None:
        return None

    sub = _Subscription(bus, "q", handler, prefetch=4, mode="concurrent", on_failure=None,
                        batch=None)  # fmt: skip
    closed = ClosedChannel(1, [])

    async def waiter() -> None:
        await asyncio.shield(sub.start(cast(AbstractIncomingMessage, closed)))

    task = asyncio.create_task(waiter())
    await asyncio.sleep(0)
    task.cancel()  # the consumer's loop is cancelled: the delivery runs on, unawaited
    await asyncio.wait(set(sub.in_hand), timeout=5)
    assert [
        r.getMessage() for r in caplog.records if r.name == "saga_shared.transport.consumer"
    ] == ["a delivery was not settled (ChannelInvalidStateError()); the broker redelivers it"]


async def batches_after_a_batch_of_two(linger: Linger) -> list[list[str]]:
    """An adapter's consumer: a batch of two, then two deliveries arriving a few loop turns
    apart; says which were handled together."""
    bus = cast(Bus, type("FakeBus", (), {"settings": Settings()})())
    batches: list[list[str]] = []
    wire: list[tuple[str, int, bool]] = []

    all_handled = asyncio.Event()

    async def handle(messages: Sequence[AbstractIncomingMessage]) -> list[BatchVerdict]:
        batches.append([m.message_id or "" for m in messages])
        if sum(map(len, batches)) == 4:
            all_handled.set()
        return [None] * len(messages)

    async def alone(delivery: AbstractIncomingMessage) -> None:
        raise AssertionError("every delivery is handled in its batch")

    sub = _Subscription(bus, "q", alone, 64, "concurrent", None, handle, linger)

    def arrive(tag: int) -> None:
        delivery = cast(AbstractIncomingMessage, Delivery(tag, wire))
        sub.unsettled.add(delivery)
        sub.inbox.put_nowait(delivery)

    arrive(1)
    arrive(2)
    worker = asyncio.create_task(sub.batches(handle, most=8))
    for tag in (3, 4):
        for _ in range(5):
            await asyncio.sleep(0)
        arrive(tag)
    await asyncio.wait_for(all_handled.wait(), 5)
    worker.cancel()
    return batches


async def test_an_adapter_batch_after_one_of_several_waits_for_company() -> None:
    assert await batches_after_a_batch_of_two(Linger(0.5, 0.25)) == [["m1", "m2"], ["m3", "m4"]]


async def test_without_a_linger_each_arrival_goes_in_the_next_batch_at_once() -> None:
    assert await batches_after_a_batch_of_two(Linger()) == [["m1", "m2"], ["m3"], ["m4"]]
