"""The demo agent: three sagas that show the product's three outcomes, each register printed."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import asyncpg

from saga_coordinator.register import SagaState
from saga_coordinator.report import render_register
from saga_coordinator.store import Store
from saga_services.faults import add_fault
from saga_shared.client import SagaClient
from saga_shared.config import Settings
from saga_shared.security.identity import Directory, database_url_for
from saga_shared.transport.bus import Bus


@dataclass(frozen=True)
class Scenario:
    title: str
    saga: str
    order_id: str
    params: dict[str, str | int]
    faults: list[tuple[str, str]] = field(default_factory=list)


def scenarios(suffix: str) -> list[Scenario]:
    refund: dict[str, str | int] = {
        "sku": "SKU-42",
        "quantity": 1,
        "amount_cents": 4999,
        "customer_email": "ada@example.com",
    }
    checkout: dict[str, str | int] = {
        "sku": "SKU-7",
        "quantity": 2,
        "amount_cents": 12900,
        "card_token": "tok_visa_4242",
        "customer_email": "grace@example.com",
    }
    return [
        Scenario("refund that completes", "refund", f"demo-{suffix}-1", refund),
        Scenario(
            "refund whose credit note fails permanently: compensated",
            "refund",
            f"demo-{suffix}-2",
            refund,
            [("erp.create_credit_note", "permanent")],
        ),
        Scenario(
            "checkout to a closed depot whose refund also fails: needs_human",
            "checkout",
            f"demo-{suffix}-3",
            {**checkout, "address": "Closed depot, 1 Harbour Road"},
            [("payments.refund_charge", "permanent")],
        ),
    ]


async def run_demo(
    settings: Settings, echo: Callable[[str], None], wait_s: float = 60.0
) -> list[SagaState]:
    suffix = time.strftime("%H%M%S")
    # The demo is an agent: it starts sagas as the agent account; it injects faults and reads
    # registers as an operator would.
    url = database_url_for(settings, "operator")
    pool = await asyncpg.create_pool(url, min_size=1, max_size=2)
    store = Store(pool)
    results: list[SagaState] = []
    agent = Directory.from_settings(settings).agent_user if settings.secrets_dir else None
    try:
        async with Bus(settings, user=agent) as bus, SagaClient(bus) as client:
            for number, scenario in enumerate(scenarios(suffix), start=1):
                echo(f"\n=== {number}. {scenario.title} (order {scenario.order_id}) ===")
                for action, mode in scenario.faults:
                    await add_fault(pool, action, scenario.order_id, mode)
                    echo(f"injected fault: {action} {mode}")
                saga_id = await client.start(
                    scenario.saga, order_id=scenario.order_id, params=scenario.params
                )
                outcome = await client.wait(saga_id, seconds=wait_s)
                state = await store.get(saga_id)
                assert state is not None, (
                    f"saga {saga_id} ended ({outcome.status}) but is not stored"
                )
                results.append(state)
                echo(render_register(state))
                if state.status == "needs_human":
                    echo(
                        f"\nto finish it: saga faults clear --order {scenario.order_id}"
                        f" && saga resume {saga_id} --wait 30"
                    )
    finally:
        await pool.close()
    return results
