"""One contract, two implementations: every test here runs against the Postgres store
(``store.Tx``) and against its in-memory twin (``memory.MemoryTx``), which the test kit runs
on. A behaviour the twin gets wrong fails here, next to the real one."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from pydantic import JsonValue

from saga_coordinator.machine import start
from saga_coordinator.memory import MemoryStore
from saga_coordinator.ports import Transaction
from saga_coordinator.register import SagaState
from saga_coordinator.rows import OutboxRow
from saga_coordinator.store import Store
from saga_shared.model.gateway import admit
from saga_shared.model.messages import AbortSaga
from tests.unit.factories import real_catalog, start_named

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
REFUND: dict[str, JsonValue] = {
    "sku": "S",
    "quantity": 1,
    "amount_cents": 5,
    "customer_email": "a@example.com",
}
Work = Callable[[Any], Awaitable[Any]]


@dataclass
class Impl:
    """One implementation, and how a test looks at what it holds."""

    name: str
    run: Callable[[Work], Awaitable[Any]]
    armed: Callable[[str], Awaitable[tuple[Any, ...] | None]]


@pytest.fixture(
    params=[
        pytest.param("postgres_impl", id="postgres", marks=pytest.mark.integration),
        pytest.param("memory_impl", id="memory"),  # no Postgres: the fast tier runs it
    ]
)
def impl(request: pytest.FixtureRequest) -> Impl:
    # Only the chosen implementation's fixture is set up, so the memory half needs no database.
    chosen: Impl = request.getfixturevalue(request.param)
    return chosen


@pytest.fixture
def memory_impl() -> Impl:
    memory = MemoryStore()

    async def armed_in_memory(saga_id: str) -> tuple[Any, ...] | None:
        a = memory.state.deadlines.get(saga_id)
        return None if a is None else (a.step, a.phase, a.key, a.attempt, a.due_at)

    return Impl("memory", memory.run, armed_in_memory)


@pytest.fixture
async def postgres_impl(pool: asyncpg.Pool) -> AsyncIterator[Impl]:
    async def armed_in_postgres(saga_id: str) -> tuple[Any, ...] | None:
        row = await pool.fetchrow(
            "SELECT step, phase, idempotency_key, attempt, due_at FROM deadlines"
            " WHERE saga_id = $1",
            saga_id,
        )
        return None if row is None else tuple(row)

    yield Impl("postgres", Store(pool).run, armed_in_postgres)
    await pool.execute("DELETE FROM outbox WHERE exchange = 'contract.test'")


def ids() -> tuple[str, str]:
    tag = uuid.uuid4().hex[:10]
    return f"saga-{tag}", f"order-{tag}"


def saga(saga_id: str, order_id: str) -> SagaState:
    command = start_named("refund", REFUND, saga_id=saga_id, order_id=order_id)
    state = start(command, admit(real_catalog(), command), NOW).state
    assert state is not None
    return state


def message(saga_id: str, order_id: str, message_id: str | None = None) -> AbortSaga:
    return AbortSaga(
        saga_id=saga_id, order_id=order_id, reason="r", message_id=message_id or uuid.uuid4().hex
    )


async def test_a_message_is_fresh_once_and_its_order_starts_empty(impl: Impl) -> None:
    saga_id, order_id = ids()
    m = message(saga_id, order_id)

    [first] = await impl.run(lambda tx: tx.claim([m]))
    [again] = await impl.run(lambda tx: tx.claim([m]))

    assert (first.fresh, again.fresh) == (True, False)
    assert (first.order.active_saga_id, first.order.next_seq, first.order.handled) == (None, 1, 0)
    assert first.order.blocks == ()
    assert (first.order.has_parked, first.order.has_waiting) == (False, False)
    assert first.saga is None


async def test_a_saved_saga_and_order_are_read_back_under_the_lock(impl: Impl) -> None:
    saga_id, order_id = ids()
    state = saga(saga_id, order_id)

    async def write(tx: Transaction) -> None:
        order = await tx.lock_order(order_id)
        tx.save_saga(state, now=NOW)
        tx.save_order(order.__class__(order_id, saga_id, 3, 7))

    await impl.run(write)
    [claim] = await impl.run(lambda tx: tx.claim([message(saga_id, order_id)]))

    assert claim.saga == state
    order = claim.order
    assert (order.active_saga_id, order.next_seq, order.handled) == (saga_id, 3, 7)


async def test_a_failed_transaction_leaves_nothing(impl: Impl) -> None:
    saga_id, order_id = ids()
    m = message(saga_id, order_id)

    async def broken(tx: Transaction) -> None:
        await tx.claim([m])
        tx.save_saga(saga(saga_id, order_id), now=NOW)
        await tx.block(order_id, "m-x", "retrying", "why")
        raise RuntimeError("work failed")

    with pytest.raises(RuntimeError):
        await impl.run(broken)
    [claim] = await impl.run(lambda tx: tx.claim([m]))

    assert claim.fresh is True
    assert claim.saga is None and claim.order.blocks == ()


async def test_waiting_sagas_come_out_oldest_first_and_learn_whom_they_wait_for(
    impl: Impl,
) -> None:
    _, order_id = ids()
    first, second = (
        saga(f"saga-{uuid.uuid4().hex[:8]}", order_id).evolve(status="waiting") for _ in range(2)
    )

    async def queue(tx: Transaction) -> None:
        tx.save_saga(first, now=NOW)
        tx.save_saga(second, now=NOW)

    await impl.run(queue)

    async def hand_over(tx: Transaction) -> SagaState | None:
        await tx.waiting_for(order_id, "saga-active")
        return await tx.next_waiting(order_id)

    oldest = await impl.run(hand_over)
    [claim] = await impl.run(lambda tx: tx.claim([message(second.saga_id, order_id)]))

    assert oldest is not None and oldest.saga_id == first.saga_id
    assert oldest.waiting_for == "saga-active"
    assert claim.saga is not None and claim.saga.waiting_for == "saga-active"
    assert claim.order.has_waiting is True


async def test_a_block_keeps_its_arrival_and_blocks_are_listed_in_arrival_order(
    impl: Impl,
) -> None:
    _, order_id = ids()

    async def blocks(tx: Transaction) -> tuple[int, int, int]:
        a = await tx.block(order_id, "m-a", "retrying", "first")
        b = await tx.block(order_id, "m-b", "dead", "second")
        again = await tx.block(order_id, "m-a", "dead", "first, dead now")
        return a, b, again

    a, b, again = await impl.run(blocks)
    view = await impl.run(lambda tx: tx.lock_order(order_id))
    lifted = await impl.run(lambda tx: tx.unblock(order_id, "m-a"))
    absent = await impl.run(lambda tx: tx.unblock(order_id, "m-a"))

    assert a < b and again == a
    assert [(x.message_id, x.state) for x in view.blocks] == [("m-a", "dead"), ("m-b", "dead")]
    assert (lifted, absent) == (a, None)


async def test_parked_messages_keep_arrival_order_once_each(impl: Impl) -> None:
    saga_id, order_id = ids()
    early, late, placed = (message(saga_id, order_id) for _ in range(3))

    async def park(tx: Transaction) -> None:
        arrival = await tx.block(order_id, "m-blocker", "dead", "blocks")
        await tx.park(early, None, "behind the block")
        await tx.park(late, 2, "behind the block")
        await tx.park(early, None, "again")  # once per message
        await tx.park(placed, None, "its own place", arrival)  # before the others

    await impl.run(park)
    parked = await impl.run(lambda tx: tx.parked(order_id))
    view = await impl.run(lambda tx: tx.lock_order(order_id))
    await impl.run(lambda tx: tx.unpark(parked[0].id))
    left = await impl.run(lambda tx: tx.parked(order_id))

    in_order = [placed.message_id, early.message_id, late.message_id]
    assert [p.message_id for p in parked] == in_order
    behind = "behind the block"
    assert [(p.seq, p.reason) for p in parked[1:]] == [(None, behind), (2, behind)]
    assert AbortSaga.model_validate_json(parked[1].body) == early
    assert view.has_parked is True
    assert [p.message_id for p in left] == [early.message_id, late.message_id]


async def test_one_deadline_per_saga_replaced_then_disarmed(impl: Impl) -> None:
    saga_id, order_id = ids()
    state = saga(saga_id, order_id)
    due = NOW + timedelta(seconds=30)

    async def arm(tx: Transaction) -> None:
        tx.arm_deadline(state, 0, "forward", "k-0", 1, NOW)
        tx.arm_deadline(state, 1, "forward", "k-1", 2, due)

    await impl.run(arm)
    armed = await impl.armed(saga_id)
    await impl.run(lambda tx: _disarm(tx, saga_id))

    assert armed == (1, "forward", "k-1", 2, due)
    assert await impl.armed(saga_id) is None


async def _disarm(tx: Transaction, saga_id: str) -> None:
    tx.disarm_deadline(saga_id)


async def test_outbox_rows_are_kept_in_the_order_written(impl: Impl) -> None:
    saga_id, order_id = ids()
    rows = [OutboxRow.of("contract.test", f"k{i}", message(saga_id, order_id)) for i in range(3)]

    async def write(tx: Transaction) -> list[OutboxRow]:
        tx.outbox(rows[:2])
        tx.outbox(rows[2:])
        await tx.flush()
        return [row for _, row in tx.sent]  # type: ignore[attr-defined]

    assert await impl.run(write) == rows


@pytest.mark.integration
async def test_published_rows_go_with_the_next_transaction_and_stay_if_it_fails(
    pool: asyncpg.Pool,
) -> None:
    """The committing task publishes its rows itself and hands their ids to its next
    transaction, which deletes them in its own last statement (a claim does not wait for
    it); a transaction that fails deletes nothing, so the relay still has them."""
    store = Store(pool)
    saga_id, order_id = ids()
    rows = [OutboxRow.of("contract.test", f"k{i}", message(saga_id, order_id)) for i in range(2)]

    async def write(tx: Transaction) -> None:
        tx.outbox(rows)

    _, sent = await store.run_publishing(write)
    published = [i for i, _ in sent]

    async def claim_then_fail(tx: Transaction) -> None:
        await tx.claim([message(saga_id, order_id)])
        raise RuntimeError("work failed")

    async def left() -> int:
        return int(await pool.fetchval("SELECT count(*) FROM outbox WHERE id = ANY($1)", published))

    with pytest.raises(RuntimeError):
        await store.run_publishing(claim_then_fail, delete=published)
    assert await left() == 2
    await store.run_publishing(lambda tx: tx.claim([message(saga_id, order_id)]), delete=published)
    assert await left() == 0
