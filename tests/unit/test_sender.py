"""The coordinator's sender: what a round publishes, what the relay is left, and the room it
gives the commits (a group waits while too much waits to go out)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import cast

from saga_coordinator.rows import OutboxRow
from saga_coordinator.sender import Sender
from saga_shared.transport.bus import Bus, Item


class SlowBus:
    """Publishes a round when told: ``release`` lets the round waiting go, confirmed."""

    def __init__(self) -> None:
        self.rounds: list[list[str | None]] = []
        self.release = asyncio.Semaphore(0)

    async def publish_many(self, items: Sequence[Item]) -> list[BaseException | None]:
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
