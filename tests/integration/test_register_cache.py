"""The coordinator keeps the registers it wrote and the claim does not read them again while
the row is at the version it wrote (``saga_coordinator.cache``). What a user would check: a
register changed by anyone else is never served stale, and a write that did not commit never
shows."""

from __future__ import annotations

import asyncpg
import pytest

from saga_coordinator.ports import Transaction
from saga_coordinator.register import SagaState
from saga_coordinator.store import Store
from tests.twins.test_store_contract import NOW, ids, message, saga


async def save(store: Store, state: SagaState) -> None:
    async def write(tx: Transaction) -> None:
        tx.save_saga(state, now=NOW)

    await store.run(write)


async def claimed(store: Store, state: SagaState) -> SagaState | None:
    [claim] = await store.run(lambda tx: tx.claim([message(state.saga_id, state.order_id)]))
    return claim.saga


async def test_the_register_held_is_the_row_as_written(pool: asyncpg.Pool) -> None:
    store = Store(pool)
    state = saga(*ids())

    await save(store, state)
    held = store.cache.get(state.saga_id)

    version = await pool.fetchval("SELECT xmin::text FROM sagas WHERE saga_id = $1", state.saga_id)
    assert held == (version, state)
    assert await claimed(store, state) == state


async def test_a_register_another_coordinator_wrote_is_read_again(pool: asyncpg.Pool) -> None:
    mine, theirs = Store(pool), Store(pool)  # two processes: one took the partition over
    state = saga(*ids())
    await save(mine, state)

    await save(theirs, state.evolve(status="compensating", reason="taken over"))

    seen = await claimed(mine, state)
    assert seen is not None and (seen.status, seen.reason) == ("compensating", "taken over")


async def test_a_register_changed_by_hand_is_read_again(pool: asyncpg.Pool) -> None:
    store = Store(pool)
    state = saga(*ids())
    await save(store, state)

    await pool.execute(
        "UPDATE sagas SET state = jsonb_set(state, '{reason}', '\"edited\"') WHERE saga_id = $1",
        state.saga_id,
    )

    seen = await claimed(store, state)
    assert seen is not None and seen.reason == "edited"


async def test_a_write_that_did_not_commit_is_not_held(pool: asyncpg.Pool) -> None:
    store = Store(pool)
    state = saga(*ids())
    await save(store, state)

    async def broken(tx: Transaction) -> None:
        tx.save_saga(state.evolve(reason="never committed"), now=NOW)
        await tx.flush()
        raise RuntimeError("work failed")

    with pytest.raises(RuntimeError):
        await store.run(broken)

    assert await claimed(store, state) == state
    held = store.cache.get(state.saga_id)
    assert held is not None and held[1] == state


async def test_registers_a_statement_changed_after_their_write_are_not_held(
    pool: asyncpg.Pool,
) -> None:
    """``waiting_for`` rewrites the order's waiting registers in SQL, in the transaction that
    wrote them: the row keeps that transaction's version, so the cache must not keep the
    register as it was written."""
    store = Store(pool)
    _, order_id = ids()
    waiting = saga(f"saga-{order_id}", order_id).evolve(status="waiting")

    async def queue_then_hand_over(tx: Transaction) -> None:
        tx.save_saga(waiting, now=NOW)
        await tx.waiting_for(order_id, "saga-active")

    await store.run(queue_then_hand_over)

    assert store.cache.get(waiting.saga_id) is None
    seen = await claimed(store, waiting)
    assert seen is not None and seen.waiting_for == "saga-active"
