"""The coordinator's sender: what a round publishes, what the relay is left, and the room it
gives the commits (a group waits while too much waits to go out)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import cast

import aiormq
import pamqp.commands

from saga_coordinator.rows import OutboxRow
from saga_coordinator.sender import Sender
from saga_shared.transport.bus import Bus, Item
from saga_shared.transport.topology import Topology


class SlowBus:
    """Publishes a round when told: ``release`` lets the round waiting go, confirmed."""

    def __init__(self) -> None:
        self.rounds: list[list[str | None]] = []
        self.release = asyncio.Semaphore(0)

    async def publish_many(
        self, items: Sequence[Item], *, local: Sequence[bool] = ()
    ) -> list[BaseException | None]:
        self.rounds.append([message.properties.message_id for _, _, message in items])
        await self.release.acquire()
        return [None] * len(items)


def rows(first: int, count: int) -> list[tuple[int, OutboxRow]]:
    return [(i, OutboxRow("x", "k", f"m{i}", "saga.started", "o", b"{}"))
            for i in range(first, first + count)]  # fmt: skip


async def turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_room_waits_while_more_than_most_rows_wait_for_a_round() -> None:
    bus, confirmed = SlowBus(), list[int]()
    sender = Sender(cast(Bus, bus), confirmed.extend)
    running = asyncio.create_task(sender.run())
    try:
        sender.send(rows(0, 3))
        await turns()  # the first round takes them and waits for its confirms
        sender.send(rows(3, 3))  # these wait for the next round
        assert bus.rounds == [["m0", "m1", "m2"]]

        room = asyncio.create_task(sender.room(2))
        await turns()
        assert not room.done()  # 3 rows wait, more than 2
        within = asyncio.create_task(sender.room(3))
        await turns()
        assert within.done()  # 3 rows wait, no more than 3

        bus.release.release()  # the first round is confirmed; the next takes the 3 rows
        await turns()
        assert room.done()
        assert bus.rounds[1] == ["m3", "m4", "m5"]
        assert confirmed == [0, 1, 2]
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)


async def test_a_stopped_sender_holds_no_commit_back() -> None:
    """Cancelled, it leaves its rows to the relay (they are in the outbox): a commit waiting
    for room must not wait for ever."""
    bus = SlowBus()
    sender = Sender(cast(Bus, bus), lambda ids: None)
    running = asyncio.create_task(sender.run())
    sender.send(rows(0, 1))
    await turns()
    sender.send(rows(1, 4))
    room = asyncio.create_task(sender.room(1))
    await turns()
    assert not room.done()

    running.cancel()
    await asyncio.gather(running, return_exceptions=True)
    await turns()

    assert room.done()
    await sender.settled()


async def test_rows_handed_in_after_the_stop_are_left_to_the_relay() -> None:
    """A delivery finished during a graceful stop commits and hands its rows in after the
    sender stopped: they stay the relay's, and neither its next commit nor the stop waits for a
    round that never comes."""
    bus = SlowBus()
    sender = Sender(cast(Bus, bus), lambda ids: None)
    running = asyncio.create_task(sender.run())
    await turns()
    running.cancel()
    await asyncio.gather(running, return_exceptions=True)

    sender.send(rows(0, 5))

    await asyncio.wait_for(sender.room(1), 1)
    await asyncio.wait_for(sender.settled(), 1)
    assert bus.rounds == []


RETURNED = aiormq.exceptions.DeliveryError(
    None, pamqp.commands.Basic.Return(reply_code=312, reply_text="NO_ROUTE", exchange="t.actions")
)


class LosingBus:
    """A broker whose request queue went with its node: a request comes back unroutable until
    the topology is declared again (as RabbitMQ returns a mandatory publish no queue takes)."""

    def __init__(self, *, declare_fails: bool = False) -> None:
        self.topology = Topology("t", 4, 5, declared_services=("inventory",))
        self.declared = 0
        self.declare_fails = declare_fails
        self.rounds: list[list[str | None]] = []

    async def declare(self) -> None:
        if self.declare_fails:
            raise ConnectionError("the broker is away")
        self.declared += 1

    async def publish_many(
        self, items: Sequence[Item], *, local: Sequence[bool] = ()
    ) -> list[BaseException | None]:
        self.rounds.append([message.properties.message_id for _, _, message in items])
        return [RETURNED if not self.declared and key.startswith("request.") else None
                for _, key, _ in items]  # fmt: skip


def request_rows() -> list[tuple[int, OutboxRow]]:
    t = Topology("t", 4, 5, declared_services=("inventory",))
    return [
        (1, OutboxRow(t.actions_exchange, "request.inventory", "r1", "action.request", "o", b"{}")),
        (2, OutboxRow(t.events_exchange, "step.started", "e1", "step.started", "o", b"{}")),
        (3, OutboxRow(t.actions_exchange, "inventory", "s1", "action.settle", "o", b"{}")),
    ]


async def test_a_request_back_unroutable_is_sent_again_once_its_queue_is_declared() -> None:
    bus, confirmed = LosingBus(), list[int]()
    sender = Sender(cast(Bus, bus), confirmed.extend)
    task = asyncio.create_task(sender.run())
    sender.send(request_rows())
    await sender.settled()
    task.cancel()

    assert bus.declared == 1
    assert bus.rounds == [["r1", "e1", "s1"], ["r1"]]  # only the request again
    assert sorted(confirmed) == [1, 2, 3]  # none left to the relay, none buried


async def test_a_request_queue_that_cannot_be_declared_leaves_the_request_to_the_relay() -> None:
    bus, confirmed = LosingBus(declare_fails=True), list[int]()
    sender = Sender(cast(Bus, bus), confirmed.extend)
    task = asyncio.create_task(sender.run())
    sender.send(request_rows())
    await sender.settled()
    task.cancel()

    assert bus.rounds == [["r1", "e1", "s1"]]
    assert sorted(confirmed) == [2, 3]  # the request stays in the outbox, for the relay
