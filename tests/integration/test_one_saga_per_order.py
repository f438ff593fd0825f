"""One active saga per order: later ones wait in arrival order; needs_human keeps the order."""

from __future__ import annotations

import asyncio

import asyncpg

from saga_app.stack import Stack
from saga_services.faults import add_fault, clear_faults
from saga_shared.client import SagaClient
from saga_shared.config import Settings
from saga_shared.transport.bus import Bus
from tests.integration.helpers import (
    REFUND,
    eventually,
    publish_start,
    ran_one_after_another,
    saga_status,
    terminal,
)


async def stuck_saga(stack: Stack, client: SagaClient, pool: asyncpg.Pool, order_id: str) -> str:
    """A refund left in needs_human (its credit note and the stock release both failed)."""
    await add_fault(pool, "erp.create_credit_note", order_id, "permanent")
    await add_fault(pool, "inventory.release_stock", order_id, "permanent")
    first = await client.start("refund", order_id=order_id, params=REFUND)
    assert (await terminal(stack, first)).status == "needs_human"
    await clear_faults(pool, order_id)
    return first


async def test_second_start_waits_for_the_first(
    stack: Stack, settings: Settings, order_id: str
) -> None:
    async with Bus(settings) as bus:
        first = await publish_start(bus, order_id)
        await asyncio.sleep(0.001)
        second = await publish_start(bus, order_id)

    a = await terminal(stack, first)
    b = await terminal(stack, second)

    assert (a.status, b.status) == ("completed", "completed")
    assert ran_one_after_another(a, b)


async def test_needs_human_keeps_the_order_until_resume(
    stack: Stack, client: SagaClient, pool: asyncpg.Pool, order_id: str
) -> None:
    first = await stuck_saga(stack, client, pool, order_id)

    second = await client.start("refund", order_id=order_id, params=REFUND)
    waiting = await stack.store.get(second)
    assert waiting is not None
    assert (waiting.status, waiting.waiting_for) == ("waiting", first)
    listed = await stack.store.list_sagas("waiting", order_id)
    assert [(r["saga_id"], r["waiting_for"]) for r in listed] == [(second, first)]

    await client.resume(first, order_id=order_id, note="stock system fixed")
    a = await terminal(stack, first)
    b = await terminal(stack, second)
    assert (a.status, b.status) == ("compensated", "completed")
    assert ran_one_after_another(a, b)


async def test_needs_human_keeps_the_order_until_resolved(
    stack: Stack, client: SagaClient, pool: asyncpg.Pool, order_id: str
) -> None:
    first = await stuck_saga(stack, client, pool, order_id)
    second = await client.start("refund", order_id=order_id, params=REFUND)
    third = await client.start("refund", order_id=order_id, params=REFUND)
    assert await saga_status(stack, second) == "waiting"

    await client.resolve(first, order_id=order_id, note="released the stock by hand")

    a = await terminal(stack, first)
    assert a.status == "resolved"
    assert [(d.kind, d.by, d.note) for d in a.decisions] == [
        ("resolve", client.bus.user, "released the stock by hand")
    ]
    b = await terminal(stack, second)
    c = await terminal(stack, third)
    assert (b.status, c.status) == ("completed", "completed")
    assert ran_one_after_another(a, b)
    assert ran_one_after_another(b, c)


async def test_abort_of_a_waiting_saga_ends_it_without_running_anything(
    stack: Stack, client: SagaClient, pool: asyncpg.Pool, order_id: str
) -> None:
    first = await stuck_saga(stack, client, pool, order_id)
    second = await client.start("refund", order_id=order_id, params=REFUND)

    await client.abort(second, order_id=order_id, reason="customer changed their mind")

    b = await eventually(
        lambda: stack.store.get(second), lambda s: s is not None and s.status == "compensated"
    )
    assert b is not None
    assert [s.status for s in b.steps] == ["skipped"] * 3
    assert await saga_status(stack, first) == "needs_human"
