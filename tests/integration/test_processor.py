"""The convoy rules inside one transaction, against the real database (no broker needed)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime

import asyncpg
import pytest

from saga_coordinator.processor import Processor
from saga_coordinator.store import Store, Tx
from saga_shared.config import Settings
from saga_shared.model.gateway import admit, load_catalog
from saga_shared.model.messages import ActionFailed, PartitionMessage, StartSaga
from saga_shared.transport.topology import Topology
from tests.integration.helpers import REFUND, forget_outbox


def start(order_id: str, saga_id: str, seq: int) -> StartSaga:
    return StartSaga(
        message_id=f"m-{saga_id}", saga_id=saga_id, order_id=order_id, saga="refund",
        params=REFUND, seq=seq,
    )  # fmt: skip


@pytest.fixture(autouse=True)
async def no_outbox_left(settings: Settings) -> AsyncIterator[None]:
    """No relay runs here: what the processor queued must not reach the next test's relay."""
    yield
    await forget_outbox(settings)


async def test_the_message_an_order_waits_for_unblocks_it_even_when_it_arrives_out_of_turn(
    settings: Settings, pool: asyncpg.Pool, order_id: str
) -> None:
    """A command dead-lettered before the intake numbered it is replayed and numbered after the
    commands that overtook it. It must lift its block on arrival and wait for its turn; were the
    block kept, the command and the ones it blocks would wait for each other for ever."""
    store = Store(pool)
    processor = Processor(load_catalog(settings.catalog_file), Topology.from_settings(settings))
    now = datetime.now(UTC)

    async def handle(message: PartitionMessage) -> str:
        return await store.run(lambda tx: processor.handle(tx, message, now))

    async def block(tx: Tx) -> None:  # what the dead-letter ingester records
        await tx.block(order_id, f"m-{order_id}-late", "dead", "dead-lettered (rejected)")

    await store.run(block)
    assert (await handle(start(order_id, f"{order_id}-a", 1))).startswith("parked: order blocked")

    note = await handle(start(order_id, f"{order_id}-late", 2))  # the replay, numbered 2

    assert note == "parked: command 2 waits for command 1"
    states = {s.saga_id: s.status for s in await store.by_order(order_id)}
    assert states == {f"{order_id}-a": "running", f"{order_id}-late": "waiting"}
    assert await store.blocks(order_id) == []
    assert await store.parked(order_id) == []


async def test_waiting_sagas_always_name_the_saga_that_holds_their_order(
    settings: Settings, pool: asyncpg.Pool, order_id: str
) -> None:
    store = Store(pool)
    processor = Processor(load_catalog(settings.catalog_file), Topology.from_settings(settings))
    now = datetime.now(UTC)

    async def handle(message: PartitionMessage) -> str:
        return await store.run(lambda tx: processor.handle(tx, message, now))

    a, b, c = (f"{order_id}-{x}" for x in "abc")
    for seq, saga_id in enumerate((a, b, c), start=1):
        await handle(start(order_id, saga_id, seq))
    # a's first step certainly failed: nothing to undo, a ends and b takes the order
    await handle(
        ActionFailed(
            saga_id=a, order_id=order_id, action="inventory.reserve_stock", phase="forward",
            step=0, idempotency_key=f"{a}:inventory.reserve_stock", reason="no stock",
            effect_unknown=False,
        )
    )  # fmt: skip

    states = {s.saga_id: s for s in await store.by_order(order_id)}
    assert [states[x].status for x in (a, b, c)] == ["compensated", "running", "waiting"]
    assert states[c].waiting_for == b
    [listed] = await store.list_sagas("waiting", order_id)
    assert listed["waiting_for"] == b


async def test_each_start_is_decided_with_the_plan_admitted_for_that_very_command(
    settings: Settings, pool: asyncpg.Pool, order_id: str
) -> None:
    """One sender may send two commands under one id (for two orders): each is decided with
    the plan the gateway admitted for it, never with the other's."""
    store = Store(pool)
    catalog = load_catalog(settings.catalog_file)
    processor = Processor(catalog, Topology.from_settings(settings))
    now = datetime.now(UTC)
    mine = start(order_id, f"{order_id}-mine", 1)
    other = StartSaga(
        message_id=mine.message_id, saga_id=f"{order_id}-other", order_id=f"{order_id}-2",
        saga="refund", params={**REFUND, "quantity": 7},
    )  # fmt: skip
    processor.plans[id(mine)] = admit(catalog, mine)
    processor.plans[id(other)] = admit(catalog, other)

    await store.run(lambda tx: processor.handle(tx, mine, now))

    saved = await store.get(mine.saga_id)
    assert saved is not None and saved.status == "running"
    assert saved.steps[0].params == {"sku": REFUND["sku"], "quantity": REFUND["quantity"]}
