"""Humans in the loop: approval gates, abort, and what the register then says."""

from __future__ import annotations

import asyncpg
import pytest
from pydantic import JsonValue, ValidationError

from saga_app.stack import Stack
from saga_services.faults import add_fault
from saga_shared.client import CommandRejected, SagaClient
from saga_shared.model.messages import Gate, Plan, PlanStep
from tests.integration.helpers import eventually, terminal

CHECKOUT: dict[str, JsonValue] = {
    "sku": "SKU-2",
    "quantity": 1,
    "amount_cents": 1200,
    "card_token": "tok_1",
    "customer_email": "b@example.com",
    "address": "1 Main Street",
}


async def at_gate(client: SagaClient, saga_id: str) -> dict[str, object]:
    stop = await client.wait(saga_id, seconds=30, stops=True)
    assert stop.type == "saga.awaiting_approval"
    assert stop.stakes is not None
    return stop.stakes


async def emails(pool: asyncpg.Pool, order_id: str) -> int:
    return int(
        await pool.fetchval("SELECT count(*) FROM sim_email_messages WHERE order_id = $1", order_id)
    )


async def test_gate_shows_what_is_at_stake_and_approval_completes(
    stack: Stack, client: SagaClient, pool: asyncpg.Pool, order_id: str
) -> None:
    saga_id = await client.start("checkout_approved", order_id=order_id, params=CHECKOUT)
    stakes = await at_gate(client, saga_id)

    assert stakes["still_to_run"] == ["email.send_confirmation"]
    assert stakes["cannot_be_undone"] == ["email.send_confirmation"]
    undo = stakes["compensating_now_would"]
    assert isinstance(undo, list)
    assert [u["undo"] for u in undo] == ["payments.charge_card", "inventory.reserve_stock"]
    assert "statement" in undo[0]["residue"]
    assert (await client.status(saga_id, order_id=order_id))["status"] == "awaiting_approval"
    assert await emails(pool, order_id) == 0

    # (that only a person's own account may approve is tested in test_roles.py; here every
    # component and this client share one account, which counts as a person)
    await client.approve(saga_id, order_id=order_id, note="address checked")
    state = await terminal(stack, saga_id)

    assert state.status == "completed"
    assert [(d.kind, d.by, d.note) for d in state.decisions] == [
        ("approve", client.bus.user, "address checked")
    ]
    assert await emails(pool, order_id) == 1


async def test_rejection_compensates_lists_the_residue_and_sends_nothing(
    stack: Stack, client: SagaClient, pool: asyncpg.Pool, order_id: str
) -> None:
    saga_id = await client.start("checkout_approved", order_id=order_id, params=CHECKOUT)
    await at_gate(client, saga_id)
    with pytest.raises(ValidationError, match="reason"):  # refused before it is even sent
        await client.reject(saga_id, order_id=order_id, reason="  ")

    await client.reject(saga_id, order_id=order_id, reason="wrong address")
    state = await terminal(stack, saga_id)

    assert state.status == "compensated"
    assert [s.status for s in state.steps] == ["compensated", "compensated", "done", "skipped"]
    assert state.steps[1].residue and "statement" in state.steps[1].residue
    assert [d.kind for d in state.decisions] == ["reject"]
    assert await emails(pool, order_id) == 0


async def test_gate_timeout_compensates(
    stack: Stack, client: SagaClient, pool: asyncpg.Pool, order_id: str
) -> None:
    plan = Plan(
        steps=(
            PlanStep(action="inventory.reserve_stock"),
            PlanStep(action="email.send_confirmation", gate=Gate(timeout_s=1.0)),
        )
    )
    params: dict[str, JsonValue] = {"sku": "S", "quantity": 1, "customer_email": "c@example.com"}
    saga_id = await client.start(order_id=order_id, plan=plan, params=params)
    state = await terminal(stack, saga_id)

    assert state.status == "compensated"
    assert [(d.kind, d.by) for d in state.decisions] == [("gate_timeout", "timer")]
    assert state.steps[1].gate_status == "timed_out"
    assert await emails(pool, order_id) == 0


async def test_a_gate_lets_an_irreversible_action_run_early_and_bad_decisions_are_refused(
    stack: Stack, client: SagaClient, order_id: str
) -> None:
    early = (PlanStep(action="email.send_confirmation"), PlanStep(action="inventory.reserve_stock"))
    params: dict[str, JsonValue] = {"sku": "S", "quantity": 1, "customer_email": "c@example.com"}
    with pytest.raises(CommandRejected, match="irreversible_not_last"):
        await client.start(order_id=order_id, plan=Plan(steps=early), params=params)

    gated = (early[0].model_copy(update={"gate": Gate()}), early[1])
    saga_id = await client.start(order_id=order_id, plan=Plan(steps=gated), params=params)
    await at_gate(client, saga_id)
    await client.approve(saga_id, order_id=order_id, note="ok")
    assert (await terminal(stack, saga_id)).status == "completed"

    with pytest.raises(CommandRejected, match="not waiting at an approval gate"):
        await client.approve(saga_id, order_id=order_id)
    with pytest.raises(CommandRejected, match="only a running saga can be aborted"):
        await client.abort(saga_id, order_id=order_id, reason="too late")


async def test_abort_while_a_step_is_in_flight_lets_it_finish_then_compensates(
    stack: Stack, client: SagaClient, pool: asyncpg.Pool, order_id: str
) -> None:
    # the charge takes a while (two transient failures with backoff): abort lands meanwhile
    await add_fault(pool, "payments.charge_card", order_id, "transient:3")
    saga_id = await client.start("checkout", order_id=order_id, params=CHECKOUT)
    await eventually(
        lambda: client.status(saga_id, order_id=order_id),
        lambda r: r["steps"][1]["status"] == "running",
    )
    await client.abort(saga_id, order_id=order_id, reason="customer cancelled")
    state = await terminal(stack, saga_id)

    assert state.status == "compensated"
    assert state.steps[1].status == "compensated"  # it finished, then it was refunded
    assert state.steps[1].result is not None
    assert [s.status for s in state.steps[2:]] == ["skipped", "skipped"]
    assert state.reason == "aborted: customer cancelled"


async def test_abort_after_the_pivot_is_reported_honestly(
    stack: Stack, client: SagaClient, pool: asyncpg.Pool, order_id: str
) -> None:
    plan = Plan(
        steps=(
            PlanStep(action="inventory.reserve_stock"),
            PlanStep(action="email.send_confirmation", gate=Gate()),
            PlanStep(action="erp.validate_address", gate=Gate()),
        )
    )
    params: dict[str, JsonValue] = {
        "sku": "S", "quantity": 1, "customer_email": "c@example.com", "address": "1 Main St",
    }  # fmt: skip
    saga_id = await client.start(order_id=order_id, plan=plan, params=params)
    await at_gate(client, saga_id)
    await client.approve(saga_id, order_id=order_id)
    await at_gate(client, saga_id)  # the e-mail went out; now before the address check

    await client.abort(saga_id, order_id=order_id, reason="changed my mind")
    state = await terminal(stack, saga_id)

    assert state.status == "compensated"
    assert state.steps[0].compensation_status == "compensated"
    assert (state.steps[1].status, state.steps[1].compensation_status) == ("done", "impossible")
    assert await emails(pool, order_id) == 1
