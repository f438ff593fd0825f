"""Sagas end to end over the real broker and database, as an agent and an operator see them."""

from __future__ import annotations

import asyncio
import json

import asyncpg
import pytest
from aio_pika.abc import AbstractIncomingMessage
from pydantic import JsonValue

from saga_app.stack import Stack
from saga_coordinator import gatekeeper, machine
from saga_coordinator.register import SagaState
from saga_services.effects import effects_for_order
from saga_services.faults import add_fault, clear_faults
from saga_shared.client import CommandRejected, SagaClient
from saga_shared.config import Settings
from saga_shared.model.catalog import Catalog
from saga_shared.model.gateway import AdmittedPlan, admit
from saga_shared.model.messages import Plan, PlanStep, StartSaga
from saga_shared.transport.bus import Bus
from tests.integration.helpers import consumers_of, eventually, remove_namespace, terminal

REFUND: dict[str, JsonValue] = {
    "sku": "SKU-1",
    "quantity": 2,
    "amount_cents": 4999,
    "customer_email": "a@example.com",
}
CHECKOUT: dict[str, JsonValue] = {
    "sku": "SKU-2",
    "quantity": 1,
    "amount_cents": 1200,
    "card_token": "tok_1",
    "customer_email": "b@example.com",
    "address": "1 Main Street",
}
WAIT_S = 30.0


async def run_saga(
    client: SagaClient, stack: Stack, saga: str, order_id: str, params: dict[str, JsonValue]
) -> SagaState:
    saga_id = await client.start(saga, order_id=order_id, params=params)
    await client.wait(saga_id, seconds=WAIT_S)
    state = await stack.store.get(saga_id)
    assert state is not None
    return state


def statuses(state: SagaState) -> list[tuple[str, str, str]]:
    return [(s.action, s.status, s.compensation_status) for s in state.steps]


async def applied(pool: asyncpg.Pool, order_id: str) -> dict[str, int]:
    """How many times each action's side effect was applied for this order."""
    effects = await effects_for_order(pool, order_id)
    counts: dict[str, int] = {}
    for row in effects["applied"]:
        action = str(row["action"])
        counts[action] = counts.get(action, 0) + int(str(row["times"]))
    return counts


async def test_a_start_is_checked_against_the_catalog_once(
    stack: Stack, client: SagaClient, order_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gateway admits a start at its partition; the decision takes that plan instead of
    checking it again (a second pass was 3% of the coordinator's CPU per saga)."""
    checked: list[str] = []

    def counted(catalog: Catalog, command: StartSaga) -> AdmittedPlan:
        checked.append(command.saga_id)
        return admit(catalog, command)

    monkeypatch.setattr(gatekeeper, "admit", counted)
    monkeypatch.setattr(machine, "admit", counted)
    state = await run_saga(client, stack, "refund", order_id, REFUND)

    assert state.status == "completed"
    assert checked == [state.saga_id]


async def test_refund_completes_with_each_effect_once(
    stack: Stack, client: SagaClient, pool: asyncpg.Pool, order_id: str
) -> None:
    state = await run_saga(client, stack, "refund", order_id, REFUND)

    assert state.status == "completed"
    assert [s.status for s in state.steps] == ["done", "done", "done"]
    assert state.steps[0].result is not None and "reservation_id" in state.steps[0].result
    effects = await effects_for_order(pool, order_id)
    assert len(effects["reservations"]) == 1
    assert len(effects["credit_notes"]) == 1
    assert len(effects["emails"]) == 1
    assert await applied(pool, order_id) == {
        "inventory.reserve_stock": 1,
        "erp.create_credit_note": 1,
        "email.send_customer_email": 1,
    }


async def test_failed_credit_note_is_compensated_and_no_email_sent(
    stack: Stack, client: SagaClient, pool: asyncpg.Pool, order_id: str
) -> None:
    await add_fault(pool, "erp.create_credit_note", order_id, "permanent")

    state = await run_saga(client, stack, "refund", order_id, REFUND)

    assert state.status == "compensated"
    assert statuses(state) == [
        ("inventory.reserve_stock", "compensated", "compensated"),
        ("erp.create_credit_note", "failed", "none"),
        ("email.send_customer_email", "skipped", "none"),
    ]
    assert "injected permanent fault" in (state.steps[1].error or "")
    effects = await effects_for_order(pool, order_id)
    assert effects["emails"] == []
    assert effects["credit_notes"] == []
    assert [r["status"] for r in effects["reservations"]] == ["released"]


async def test_failed_compensation_needs_human_then_resume_finishes_only_what_is_left(
    stack: Stack, client: SagaClient, pool: asyncpg.Pool, order_id: str
) -> None:
    await add_fault(pool, "payments.charge_card", order_id, "permanent")
    await add_fault(pool, "inventory.release_stock", order_id, "permanent")
    plan = Plan(
        steps=(
            PlanStep(action="erp.create_credit_note"),
            PlanStep(action="inventory.reserve_stock"),
            PlanStep(action="payments.charge_card"),
        )
    )
    params: dict[str, JsonValue] = {
        "amount_cents": 100,
        "sku": "S",
        "quantity": 1,
        "card_token": "tok",
    }
    saga_id = await client.start(order_id=order_id, plan=plan, params=params)
    alert = await client.wait(saga_id, seconds=WAIT_S)

    assert alert.type == "saga.needs_human"
    assert alert.saga_register is not None
    assert alert.saga_register["status"] == "needs_human"
    assert "inventory.release_stock" in alert.detail
    state = await stack.store.get(saga_id)
    assert state is not None and state.status == "needs_human"
    # Reverse order of landing: the reservation (landed last) is undone first, and it failed, so
    # the credit note's compensation has not been attempted yet.
    assert statuses(state) == [
        ("erp.create_credit_note", "done", "pending"),
        ("inventory.reserve_stock", "compensation_failed", "failed"),
        ("payments.charge_card", "failed", "none"),
    ]

    await clear_faults(pool, order_id)
    await client.resume(saga_id, order_id=order_id, note="inventory fixed")
    outcome = await client.wait(saga_id, seconds=WAIT_S)

    assert outcome.type == "saga.compensated"
    state = await stack.store.get(saga_id)
    assert state is not None and state.status == "compensated"
    assert [s.compensation_status for s in state.steps] == ["compensated", "compensated", "none"]
    assert [d.kind for d in state.decisions] == ["resume"]
    counts = await applied(pool, order_id)
    assert counts["inventory.release_stock"] == 1
    assert counts["erp.void_credit_note"] == 1
    assert "payments.refund_charge" not in counts  # the charge never landed


async def test_transient_failures_are_retried_and_applied_once(
    stack: Stack, client: SagaClient, pool: asyncpg.Pool, order_id: str
) -> None:
    await add_fault(pool, "erp.create_credit_note", order_id, "transient:2")

    state = await run_saga(client, stack, "refund", order_id, REFUND)

    assert state.status == "completed"
    assert state.steps[1].attempts == 3
    assert (await applied(pool, order_id))["erp.create_credit_note"] == 1


async def test_priority_compensates_the_erp_first(
    stack: Stack, client: SagaClient, pool: asyncpg.Pool, order_id: str
) -> None:
    await add_fault(pool, "payments.charge_card", order_id, "permanent")
    plan = Plan(
        steps=(
            PlanStep(action="erp.create_credit_note"),
            PlanStep(action="inventory.reserve_stock"),
            PlanStep(action="payments.charge_card"),
        ),
        compensation_priority=("erp.create_credit_note",),
    )
    params: dict[str, JsonValue] = {
        "amount_cents": 100,
        "sku": "S",
        "quantity": 1,
        "card_token": "tok",
    }
    saga_id = await client.start(order_id=order_id, plan=plan, params=params)
    await client.wait(saga_id, seconds=WAIT_S)

    state = await stack.store.get(saga_id)
    assert state is not None and state.status == "compensated"
    erp, inventory = state.steps[0], state.steps[1]
    assert erp.compensated_at is not None and inventory.compensated_at is not None
    assert erp.compensated_at < inventory.compensated_at
    effects = await effects_for_order(pool, order_id)
    order = [r["action"] for r in effects["applied"]]
    assert order.index("erp.void_credit_note") < order.index("inventory.release_stock")


@pytest.mark.parametrize(
    ("steps", "rule", "step"),
    [
        (["email.send_confirmation", "inventory.reserve_stock"], "irreversible_not_last", 0),
        (["inventory.reserve_stock", "shipping.book_courier"], "unknown_action", 1),
        (["inventory.reserve_stock", "inventory.release_stock"], "compensation_as_step", 1),
        (["inventory.reserve_stock", "inventory.reserve_stock"], "duplicate_action", 1),
    ],
)
async def test_gateway_refuses_bad_plans_naming_step_and_rule(
    stack: Stack, client: SagaClient, order_id: str, steps: list[str], rule: str, step: int
) -> None:
    plan = Plan(steps=tuple(PlanStep(action=a) for a in steps))
    with pytest.raises(CommandRejected) as refused:
        await client.start(order_id=order_id, plan=plan, params={})

    assert f"[{rule}]" in refused.value.reason
    assert f"step {step}" in refused.value.reason
    assert await stack.store.by_order(order_id) == []
    recorded = await stack.store.rejections(order_id)
    assert [r["rule"] for r in recorded] == [rule]


async def test_bad_params_are_refused_naming_the_field(
    stack: Stack, client: SagaClient, order_id: str
) -> None:
    with pytest.raises(CommandRejected) as refused:
        await client.start("refund", order_id=order_id, params={**REFUND, "quantity": "two"})
    assert "params.quantity" in refused.value.reason

    with pytest.raises(CommandRejected) as unknown:
        await client.start("refnud", order_id=order_id, params=REFUND)
    assert "unknown_saga" in unknown.value.reason
    assert await stack.store.by_order(order_id) == []


async def test_checkout_completes(stack: Stack, client: SagaClient, order_id: str) -> None:
    state = await run_saga(client, stack, "checkout", order_id, CHECKOUT)
    assert state.status == "completed"
    assert [s.status for s in state.steps] == ["done"] * 4


async def test_a_consumer_the_broker_cancelled_subscribes_again(
    stack: Stack, client: SagaClient, order_id: str
) -> None:
    """Someone deletes the e-mail queue: the adapter notices, re-declares it and carries on."""
    name = stack.bus.topology.action_queue("email")
    channel = await stack.bus.connection.channel()
    await channel.queue_delete(name)
    await channel.close()

    await eventually(lambda: consumers_of(stack.bus, name), lambda n: n >= 1, seconds=20)
    state = await run_saga(client, stack, "refund", order_id, REFUND)
    assert state.status == "completed"


async def test_saga_events_setting_publishes_only_the_chosen_events(
    settings: Settings, order_id: str
) -> None:
    chosen = settings.with_(events="saga.*")
    async with Stack(chosen) as running, Bus(chosen) as bus, SagaClient(bus) as agent:
        channel = await bus.connection.channel()
        tap = await channel.declare_queue(exclusive=True, auto_delete=True)
        await tap.bind(bus.topology.events_exchange, routing_key="#")
        seen: list[str] = []

        async def keep(message: AbstractIncomingMessage) -> None:
            seen.append(json.loads(message.body)["type"])

        await tap.consume(keep, no_ack=True)
        saga = await agent.start("refund", order_id=order_id, params=REFUND)
        state = await terminal(running, saga)
        await eventually(lambda: asyncio.sleep(0, seen), lambda s: "saga.completed" in s)
        await channel.close()
    await remove_namespace(chosen)

    assert state.status == "completed" and len(state.steps) == 3  # the register has every step
    assert seen == ["saga.started", "saga.completed"]
