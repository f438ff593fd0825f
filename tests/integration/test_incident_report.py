"""The incident report, and a `done` that lacks the identifier its compensation needs."""

from __future__ import annotations

import asyncpg
from pydantic import JsonValue

from saga_app.stack import Stack
from saga_coordinator.incident import incident, render_markdown
from saga_shared.client import SagaClient
from saga_shared.config import Settings
from saga_shared.model.messages import ActionDone
from saga_shared.transport.bus import Bus
from tests.integration.helpers import REFUND, eventually, remove_namespace, terminal
from tests.integration.test_cli import saga, saga_json

CLOSED_DEPOT: dict[str, JsonValue] = {
    "sku": "SKU-7",
    "quantity": 2,
    "amount_cents": 12900,
    "card_token": "tok_visa",
    "customer_email": "grace@example.com",
    "address": "Closed depot, 1 Harbour Road",
}


async def test_the_second_articles_failed_order(
    stack: Stack, client: SagaClient, settings: Settings, order_id: str
) -> None:
    saga_id = await client.start("checkout", order_id=order_id, params=CLOSED_DEPOT)
    state = await terminal(stack, saga_id)
    report = incident(state)

    assert report["status"] == "compensated"
    assert [d["action"] for d in report["done"]] == [
        "inventory.reserve_stock",
        "payments.charge_card",
    ]
    # two compensations, in reverse order, each with what it did
    assert [(p["action"], p["by"]) for p in report["put_back"]] == [
        ("payments.charge_card", "payments.refund_charge"),
        ("inventory.reserve_stock", "inventory.release_stock"),
    ]
    assert "refund_id" in report["put_back"][0]["identifiers"]
    [residue] = report["residue"]
    assert residue["action"] == "payments.charge_card"
    assert "statement" in residue["residue"]
    assert [n["action"] for n in report["never_happened"]] == ["email.send_confirmation"]

    shown = await saga_json(settings, "show", saga_id)
    assert shown["report"]["put_back"][0]["by"] == "payments.refund_charge"
    code, markdown, _ = await saga(settings, "show", saga_id, "--format", "markdown")
    assert code == 0
    assert markdown.strip() == render_markdown(state).strip()
    assert "## What never happened\n\n- email.send_confirmation" in markdown
    assert "## Residue the customer will see\n\n- payments.charge_card: The charge" in markdown


async def test_done_without_the_identifier_is_compensated_as_an_unknown_effect(
    settings: Settings, pool: asyncpg.Pool, order_id: str
) -> None:
    """A buggy adapter says `done` but leaves out the reservation id."""
    others = ["coordinator", "erp", "payments", "email"]
    async with Stack(settings, others) as stack, Bus(settings) as bus, SagaClient(bus) as client:
        saga_id = await client.start("refund", order_id=order_id, params=REFUND)
        await eventually(lambda: stack.store.get(saga_id), lambda s: s is not None)
        careless = ActionDone(
            saga_id=saga_id,
            order_id=order_id,
            action="inventory.reserve_stock",
            phase="forward",
            step=0,
            idempotency_key=f"{saga_id}:inventory.reserve_stock",
            result={"note": "reserved, trust me"},
        )
        await bus.to_partition(careless)
        stuck = await eventually(
            lambda: stack.store.get(saga_id),
            lambda s: s is not None and s.steps[0].status == "failed",
        )
        assert stuck is not None and stuck.steps[0].effect_unknown
        assert "reservation_id" in (stuck.steps[0].error or "")
        async with Stack(settings, ["inventory"]):  # the real adapter: reserve, then release
            state = await terminal(stack, saga_id)
    await remove_namespace(settings)

    assert state.status == "compensated"
    assert state.steps[0].compensation_status == "compensated"
    held = await pool.fetchval(
        "SELECT count(*) FROM sim_inventory_reservations"
        " WHERE order_id = $1 AND status = 'reserved'",
        order_id,
    )
    assert held == 0
