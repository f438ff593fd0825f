"""Group commit: what goes in one transaction, and what a failed one does to its messages."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import datetime

import pytest

from saga_coordinator.group_commit import GroupCommit
from saga_shared.errors import RetryLater
from saga_shared.model.messages import PartitionMessage, StartSaga
from saga_shared.transport.linger import Linger
from tests.unit.factories import REFUND_PARAMS


def start(order_id: str, saga_id: str) -> StartSaga:
    return StartSaga(saga_id=saga_id, order_id=order_id, saga="refund", params=REFUND_PARAMS)


class Recorder:
    """Stands in for the transaction: records each batch; fails where told."""

    def __init__(self, bad: str = "", database_away: bool = False) -> None:
        self.batches: list[list[str]] = []
        self.bad = bad
        self.database_away = database_away
        self.gate = asyncio.Event()
        self.gate.set()

    async def apply(self, messages: Sequence[PartitionMessage], now: datetime) -> list[str]:
        self.batches.append([m.saga_id for m in messages])
        await self.gate.wait()
        if self.database_away:
            raise RetryLater("database unavailable")
        if any(m.saga_id == self.bad for m in messages):
            raise RuntimeError(f"bug on {self.bad}")
        return [f"applied {m.saga_id}" for m in messages]


async def test_messages_arriving_during_a_transaction_share_the_next_one() -> None:
    recorder = Recorder()
    group = GroupCommit(recorder.apply, max_batch=8)
    recorder.gate.clear()
    first = asyncio.create_task(group.submit(start("o1", "s1")))
    await asyncio.sleep(0)  # s1's transaction is running
    others = [asyncio.create_task(group.submit(start(f"o{i}", f"s{i}"))) for i in (2, 3, 4)]
    await asyncio.sleep(0)
    recorder.gate.set()

    notes = await asyncio.gather(first, *others)

    assert notes == [f"applied s{i}" for i in (1, 2, 3, 4)]
    assert recorder.batches == [["s1"], ["s2", "s3", "s4"]]


async def test_a_transaction_never_holds_two_messages_of_one_order_nor_more_than_the_max() -> None:
    recorder = Recorder()
    group = GroupCommit(recorder.apply, max_batch=2)
    recorder.gate.clear()
    first = asyncio.create_task(group.submit(start("o0", "s0")))
    await asyncio.sleep(0)
    rest = [
        asyncio.create_task(group.submit(start(order, saga)))
        for order, saga in (("o1", "a"), ("o1", "b"), ("o2", "c"), ("o3", "d"))
    ]
    await asyncio.sleep(0)
    recorder.gate.set()

    await asyncio.gather(first, *rest)

    assert recorder.batches == [["s0"], ["a", "c"], ["b", "d"]]


async def test_a_failing_batch_is_split_and_only_the_bad_message_fails() -> None:
    recorder = Recorder(bad="s3")
    group = GroupCommit(recorder.apply, max_batch=8)
    recorder.gate.clear()
    first = asyncio.create_task(group.submit(start("o1", "s1")))
    await asyncio.sleep(0)
    others = [asyncio.create_task(group.submit(start(f"o{i}", f"s{i}"))) for i in (2, 3, 4)]
    await asyncio.sleep(0)
    recorder.gate.set()

    results = await asyncio.gather(first, *others, return_exceptions=True)

    assert results[:2] == ["applied s1", "applied s2"] and results[3] == "applied s4"
    assert isinstance(results[2], RuntimeError)
    assert recorder.batches[1:] == [["s2", "s3", "s4"], ["s2"], ["s3"], ["s4"]]


async def test_while_the_database_is_away_the_batch_is_not_split() -> None:
    recorder = Recorder(database_away=True)
    group = GroupCommit(recorder.apply, max_batch=8)
    recorder.gate.clear()
    first = asyncio.create_task(group.submit(start("o1", "s1")))
    await asyncio.sleep(0)
    others = [asyncio.create_task(group.submit(start(f"o{i}", f"s{i}"))) for i in (2, 3)]
    await asyncio.sleep(0)
    recorder.gate.set()

    results = await asyncio.gather(first, *others, return_exceptions=True)

    assert all(isinstance(r, RetryLater) for r in results)
    assert recorder.batches == [["s1"], ["s2", "s3"]]


@pytest.mark.parametrize("count", [1, 5])
async def test_every_message_gets_its_own_note(count: int) -> None:
    group = GroupCommit(Recorder().apply, max_batch=8)
    notes = await asyncio.gather(*(group.submit(start(f"o{i}", f"s{i}")) for i in range(count)))
    assert notes == [f"applied s{i}" for i in range(count)]


async def test_messages_handed_in_at_the_same_moment_share_one_transaction() -> None:
    """A partition hands in the messages at its head together: one transaction for them all,
    not one for the first and one for the rest."""
    recorder = Recorder()
    group = GroupCommit(recorder.apply, max_batch=8)
    notes = await asyncio.gather(*(group.submit(start(f"o{i}", f"s{i}")) for i in range(4)))
    assert notes == [f"applied s{i}" for i in range(4)]
    assert recorder.batches == [["s0", "s1", "s2", "s3"]]


async def test_a_message_behind_a_failed_one_of_its_order_fails_too() -> None:
    """It waited for the next transaction; applied there it would overtake the failed one,
    which goes back to its queue (and blocks the order once its failure is recorded)."""
    recorder = Recorder(bad="a")
    group = GroupCommit(recorder.apply, max_batch=8)
    submitted = [("o1", "a"), ("o2", "b"), ("o1", "c")]
    results = await asyncio.gather(
        *(group.submit(start(order, saga)) for order, saga in submitted), return_exceptions=True
    )
    assert isinstance(results[0], RuntimeError)
    assert results[1] == "applied b"
    assert isinstance(results[2], RetryLater)
    assert "c" not in [saga for batch in recorder.batches for saga in batch]


async def test_a_transaction_waits_until_ready_and_takes_what_arrived_meanwhile() -> None:
    """The coordinator's commits wait for its publishes: no transaction starts before
    ``ready`` returns, and the messages handed in during the wait join the one that does."""
    recorder = Recorder()
    ready = asyncio.Event()

    async def wait_ready() -> None:
        await ready.wait()

    group = GroupCommit(recorder.apply, max_batch=8, ready=wait_ready)
    first = asyncio.create_task(group.submit(start("o1", "s1")))
    for _ in range(5):
        await asyncio.sleep(0)
    others = [asyncio.create_task(group.submit(start(f"o{i}", f"s{i}"))) for i in (2, 3)]
    for _ in range(5):
        await asyncio.sleep(0)
    assert recorder.batches == []  # nothing ran while not ready

    ready.set()
    notes = await asyncio.gather(first, *others)

    assert notes == ["applied s1", "applied s2", "applied s3"]
    assert recorder.batches == [["s1", "s2", "s3"]]


async def first_batch_of_two(group: GroupCommit) -> None:
    together = [asyncio.create_task(group.submit(start(f"o{i}", f"s{i}"))) for i in (1, 2)]
    await asyncio.gather(*together)


async def test_after_a_batch_of_several_the_next_waits_for_company() -> None:
    """Under load a transaction waits a little (``saga_shared.transport.linger``) so the messages
    arriving
    meanwhile share it, instead of each paying a statement and a WAL flush of its own."""
    recorder = Recorder()
    group = GroupCommit(recorder.apply, max_batch=8, linger=Linger(0.5, 0.25))
    await first_batch_of_two(group)

    third = asyncio.create_task(group.submit(start("o3", "s3")))
    for _ in range(5):
        await asyncio.sleep(0)
    fourth = asyncio.create_task(group.submit(start("o4", "s4")))  # arrives while s3 waits
    await asyncio.gather(third, fourth)

    assert recorder.batches == [["s1", "s2"], ["s3", "s4"]]


async def test_after_a_batch_of_one_nothing_waits() -> None:
    """A lone message (concurrency 1) never waits: the linger would be latency and nothing else."""
    recorder = Recorder()
    group = GroupCommit(recorder.apply, max_batch=8, linger=Linger(60.0, 60.0))
    await group.submit(start("o1", "s1"))

    note = await asyncio.wait_for(group.submit(start("o2", "s2")), 5)

    assert note == "applied s2"
    assert recorder.batches == [["s1"], ["s2"]]
