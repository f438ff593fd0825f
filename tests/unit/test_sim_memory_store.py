"""The in-memory store undoes a failed transaction from its log of changes: whatever the work
did before it raised (or was cancelled), nothing of it stays, the indexes included."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import random
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from saga_coordinator.convoy import OrderView
from saga_coordinator.machine import start
from saga_coordinator.memory import MemoryState, MemoryStore, MemoryTx
from saga_coordinator.register import SagaState
from saga_coordinator.rows import OutboxRow
from saga_shared.model.gateway import admit
from saga_shared.model.messages import AbortSaga, CommandReply
from tests.unit.factories import REFUND_PARAMS, real_catalog, start_named

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def _template() -> SagaState:
    command = start_named("refund", REFUND_PARAMS, saga_id="saga-0", order_id="order-0")
    state = start(command, admit(real_catalog(), command), NOW).state
    assert state is not None
    return state


TEMPLATE = _template()


def saga(saga_id: str, order_id: str, status: str = "running") -> SagaState:
    update = {"saga_id": saga_id, "order_id": order_id, "status": status}
    return TEMPLATE.model_copy(update=update)


def msg(message_id: str, order_id: str = "o-1", saga_id: str = "s-1") -> AbortSaga:
    return AbortSaga(
        saga_id=saga_id, order_id=order_id, reason="r", message_id=message_id, timestamp=NOW
    )


async def everything(tx: MemoryTx, then: Callable[[], None] = lambda: None) -> None:
    """Touch every part of the state, then ``then`` (which may raise)."""
    await tx.claim([msg("m-new", "o-new"), msg("m-old")])
    tx.save_order(OrderView("o-1", "s-new", 9, 9))
    await tx.block("o-1", "m-blocking", "dead", "again")
    await tx.block("o-new", "m-b2", "retrying", "new")
    await tx.unblock("o-1", "m-other")
    await tx.park(msg("m-parked-2", "o-new"), None, "behind")
    [parked] = await tx.parked("o-1")
    await tx.unpark(parked.id)
    tx.refusal(msg("m-refused"), "rule", "no", "agent")
    await tx.waiting_for("o-1", "s-new")
    tx.save_saga(saga("s-1", "o-1", "compensating"), now=NOW)
    tx.save_saga(saga("s-new", "o-new", "waiting"), now=NOW)
    tx.log(msg("m-new"), "s-1", "note", None)
    tx.arm_deadline(saga("s-1", "o-1"), 1, "forward", "k", 2, NOW)
    tx.disarm_deadline("s-waiting")
    tx.outbox([OutboxRow.of("x", "k", msg("m-out"))])
    tx.remember_reply("m-new", CommandReply(type="command.accepted", saga_id="s-1",
                                            order_id="o-1", command_id="c-1",
                                            command_type="saga.start"))  # fmt: skip
    then()


async def filled() -> MemoryStore:
    store = MemoryStore()

    async def fill(tx: MemoryTx) -> None:
        await tx.claim([msg("m-old")])
        tx.save_saga(saga("s-1", "o-1"), now=NOW)
        tx.save_saga(saga("s-waiting", "o-1", "waiting"), now=NOW)
        await tx.block("o-1", "m-blocking", "retrying", "first")
        await tx.block("o-1", "m-other", "dead", "second")
        await tx.park(msg("m-parked"), 3, "behind")
        tx.refusal(msg("m-refused-before"), "rule", "no", None)
        tx.log(msg("m-old"), "s-1", "note", 1)
        tx.arm_deadline(saga("s-waiting", "o-1"), 0, "forward", "k0", 1, NOW)
        tx.outbox([OutboxRow.of("x", "k", msg("m-out-before"))])

    await store.run(fill)
    return store


def broken() -> None:
    raise RuntimeError("half-way")


def test_a_transaction_that_raises_half_way_leaves_the_state_exactly_as_before() -> None:
    async def body() -> tuple[MemoryState, MemoryState, MemoryState]:
        store = await filled()
        before = copy.deepcopy(store.state)
        with pytest.raises(RuntimeError, match="half-way"):
            await store.run(lambda tx: everything(tx, broken))
        failed = copy.deepcopy(store.state)
        await store.run(everything)
        return before, failed, store.state

    before, failed, committed = asyncio.run(body())
    assert failed == before
    # the same work, committed, changes every part of the state: the check above can fail
    changed = {
        f.name
        for f in dataclasses.fields(MemoryState)
        if getattr(committed, f.name) != getattr(before, f.name)
    }
    assert changed == {f.name for f in dataclasses.fields(MemoryState)}


def test_a_cancelled_transaction_leaves_nothing_and_the_next_one_runs() -> None:
    async def body() -> tuple[MemoryState, MemoryState, bool]:
        store = await filled()
        before = copy.deepcopy(store.state)

        async def slow(tx: MemoryTx) -> None:
            await everything(tx)
            await asyncio.sleep(3600)

        task = asyncio.create_task(store.run(slow))
        await asyncio.sleep(0)
        waiting = asyncio.create_task(store.run(lambda tx: tx.lock_order("o-1")))
        await asyncio.sleep(0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await waiting
        return before, store.state, task.cancelled()

    before, after, cancelled = asyncio.run(body())
    assert cancelled and after == before


# (operation, order, saga id, message id, saga status, a fraction)
RandomOp = tuple[str, str, str, str, str, float]
KINDS = (
    "claim", "block", "unblock", "park", "unpark", "waiting_for", "next_waiting", "save_saga",
    "save_order", "arm", "disarm", "outbox", "log", "refusal",
)  # fmt: skip


def _random_ops(rng: random.Random, n: int) -> list[RandomOp]:
    """A few of the store's operations over a handful of orders, sagas and messages."""
    return [
        (
            rng.choice(KINDS),
            rng.choice(("o-1", "o-2", "o-3")),
            f"s-{rng.randrange(4)}",
            f"m-{rng.randrange(8)}",
            rng.choice(("running", "waiting")),
            rng.random(),
        )
        for _ in range(n)
    ]


async def apply(tx: MemoryTx, op: RandomOp) -> None:
    kind, order, saga_id, message_id, status, fraction = op
    m = msg(message_id, order, saga_id)
    if kind == "claim":
        await tx.claim([m])
    elif kind == "block":
        await tx.block(order, message_id, "dead", "r")
    elif kind == "unblock":
        await tx.unblock(order, message_id)
    elif kind == "park":
        await tx.park(m, None, "r")
    elif kind == "unpark":
        parked = await tx.parked(order)
        if parked:
            await tx.unpark(parked[int(fraction * len(parked))].id)
    elif kind == "waiting_for":
        await tx.waiting_for(order, saga_id)
    elif kind == "next_waiting":
        await tx.next_waiting(order)
    elif kind == "save_saga":  # a saga id may move between orders: the index must follow
        tx.save_saga(saga(saga_id, order, status), now=NOW)
    elif kind == "save_order":
        tx.save_order(OrderView(order, saga_id, 2, 1))
    elif kind == "arm":
        tx.arm_deadline(saga(saga_id, order), 0, "forward", "k", 1, NOW + timedelta(fraction))
    elif kind == "disarm":
        tx.disarm_deadline(saga_id)
    elif kind == "outbox":
        tx.outbox([OutboxRow.of("x", "k", m)])
    elif kind == "log":
        tx.log(m, saga_id, "n", None)
    else:
        tx.refusal(m, "rule", "r", None)


def _indexes(state: MemoryState) -> tuple[object, ...]:
    """The indexes as rebuilt from the tables (empty entries left out)."""
    waiting: dict[str, dict[str, int]] = {}
    for sid, row in state.sagas.items():
        if row.status == "waiting":
            waiting.setdefault(row.order_id, {})[sid] = row.arrival
    parked_of: dict[str, set[int]] = {}
    for ident, (order, _) in state.parked.items():
        parked_of.setdefault(order, set()).add(ident)
    parked_ids = {p.message_id: ident for ident, (_, p) in state.parked.items()}
    return waiting, parked_of, parked_ids


def _kept_indexes(state: MemoryState) -> tuple[object, ...]:
    waiting = {o: s for o, s in state.waiting.items() if s}
    parked_of = {o: set(ids) for o, ids in state.parked_of.items() if ids}
    return waiting, parked_of, state.parked_ids


def test_random_work_with_random_failures_ends_as_the_same_work_without_them() -> None:
    async def body(seed: int) -> int:
        rng = random.Random(seed)
        failing, clean = MemoryStore(), MemoryStore()
        failures = 0
        for _ in range(300):
            ops = _random_ops(rng, rng.randrange(1, 7))
            fail_at = rng.randrange(len(ops) + 3)  # past the end: it commits

            async def work(tx: MemoryTx, ops: list[RandomOp] = ops, fail_at: int = fail_at) -> None:
                for i, op in enumerate(ops):
                    if i == fail_at:
                        raise RuntimeError("injected")
                    await apply(tx, op)

            try:
                await failing.run(work)
            except RuntimeError:
                failures += 1
            else:
                await clean.run(work)
            assert failing.state == clean.state
            assert _kept_indexes(failing.state) == _indexes(failing.state)
        return failures

    for seed in range(4):
        assert 50 < asyncio.run(body(seed)) < 250
