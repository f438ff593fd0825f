"""The test kit, as a user runs it: their own catalog and service functions, in memory, with
faults and a fake clock; no RabbitMQ, no Postgres."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from pydantic import BaseModel, JsonValue

from saga_app.testkit import SagaKit
from saga_services.sdk import Call, Resources, Result, Service, Undo
from saga_shared.client import CommandRejected
from saga_shared.errors import PlanRejected
from saga_shared.model.catalog import Catalog, read_catalog
from saga_shared.model.gateway import check_catalog

CATALOG = """
[actions."shop.reserve"]
class = "compensable"
compensation = "shop.release"
params = { sku = "str" }
result = ["reservation_id"]
timeout_s = 5
sends = 2
retry = { attempts = 3, initial_backoff_s = 0.5, max_backoff_s = 5 }

[actions."shop.charge"]
class = "compensable_with_residue"
compensation = "shop.refund"
residue = "both lines stay on the statement"
params = { amount_cents = "int" }
result = ["charge_id"]
timeout_s = 5

[actions."shop.notify"]
class = "irreversible"
params = { email = "str" }
timeout_s = 5

[compensations."shop.release"]
timeout_s = 5

[compensations."shop.refund"]
timeout_s = 5

[sagas.order]
steps = ["shop.reserve", "shop.charge", "shop.notify"]

[sagas.approved_order]
steps = ["shop.reserve", "shop.charge", "shop.notify"]

[sagas.approved_order.gates."shop.notify"]
timeout_s = 3600
on_timeout = "compensate"
require_person = true
"""
PARAMS: dict[str, JsonValue] = {"sku": "S-1", "amount_cents": 1200, "email": "a@example.com"}


class Shop:
    """The user's fake system: applies each key once, like a real API."""

    def __init__(self) -> None:
        self.held: dict[str, str] = {}  # key -> reservation
        self.charged: dict[str, str] = {}  # key -> charge
        self.released: list[str] = []
        self.refunded: list[str] = []
        self.sent: list[str] = []


@contextlib.asynccontextmanager
async def shop(resources: Resources) -> AsyncIterator[Shop]:
    yield Shop()


SHOP = Service("shop", setup=shop)


class Reserve(BaseModel):
    sku: str


class Charge(BaseModel):
    amount_cents: int


class Notify(BaseModel):
    email: str


class Release(Undo):
    reservation_id: str | None = None


class Refund(Undo):
    charge_id: str | None = None


@SHOP.action("shop.reserve")
async def reserve(call: Call[Reserve, Shop]) -> Result:
    return {"reservation_id": call.deps.held.setdefault(call.key, f"r-{call.params.sku}")}


@SHOP.action("shop.charge")
async def charge(call: Call[Charge, Shop]) -> Result:
    return {"charge_id": call.deps.charged.setdefault(call.key, f"c-{call.params.amount_cents}")}


@SHOP.action("shop.notify")
async def notify(call: Call[Notify, Shop]) -> Result:
    call.deps.sent.append(call.params.email)
    return {}


def undo(params: Undo, id_field: str, made: dict[str, str], undone: list[str]) -> bool:
    """Undo what the forward call made, found by its id or by its key; False: nothing was."""
    target = params.target(id_field)
    found = target.get(id_field) or made.get(str(target.get("forward_key")))
    if isinstance(found, str):
        undone.append(found)
    return found is not None


@SHOP.compensation("shop.release")
async def release(call: Call[Release, Shop]) -> Result:
    shop = call.deps
    return {"released": undo(call.params, "reservation_id", shop.held, shop.released)}


@SHOP.compensation("shop.refund")
async def refund(call: Call[Refund, Shop]) -> Result:
    shop = call.deps
    return {"refunded": undo(call.params, "charge_id", shop.charged, shop.refunded)}


@pytest.fixture
def catalog(tmp_path: Path) -> Catalog:
    path = tmp_path / "shop.toml"
    path.write_text(CATALOG, encoding="utf-8")
    loaded = read_catalog(path)
    check_catalog(loaded)
    return loaded


@pytest.fixture
async def kit(catalog: Catalog) -> AsyncIterator[SagaKit]:
    async with SagaKit(catalog, [SHOP]) as running:
        yield running


async def test_a_saga_completes_each_function_called_once(kit: SagaKit) -> None:
    started = time.perf_counter()
    saga_id = await kit.start("order", order_id="o-1", params=PARAMS)
    took = time.perf_counter() - started

    assert kit.status(saga_id) == "completed"
    assert [r.action for r in kit.calls] == ["shop.reserve", "shop.charge", "shop.notify"]
    assert kit.events(saga_id) == ["saga.started", "saga.completed"]
    assert kit.deps("shop").sent == ["a@example.com"]
    assert kit.register(saga_id).steps[0].result == {"reservation_id": "r-S-1"}
    print(f"one saga in memory: {took * 1000:.1f} ms")


async def test_a_permanent_failure_undoes_what_landed_in_reverse(kit: SagaKit) -> None:
    kit.fail("shop.notify", "permanent")
    saga_id = await kit.start("order", order_id="o-2", params=PARAMS)
    state = kit.register(saga_id)

    assert state.status == "compensated"
    assert [(s.status, s.compensation_status) for s in state.steps] == [
        ("compensated", "compensated"), ("compensated", "compensated"), ("failed", "none"),
    ]  # fmt: skip
    undo = [r.action for r in kit.calls if r.phase == "compensation"]
    assert undo == ["shop.refund", "shop.release"]
    assert (kit.deps("shop").refunded, kit.deps("shop").released) == (["c-1200"], ["r-S-1"])


async def test_transient_failures_are_retried_without_waiting(kit: SagaKit) -> None:
    kit.fail("shop.reserve", "transient", times=2)
    saga_id = await kit.start("order", order_id="o-3", params=PARAMS)

    assert kit.status(saga_id) == "completed"
    assert [r.action for r in kit.calls].count("shop.reserve") == 3
    assert kit.register(saga_id).steps[0].attempts == 3


async def test_a_call_that_never_answers_is_resent_then_undone_by_its_key(kit: SagaKit) -> None:
    kit.fail("shop.charge", "hang")
    saga_id = await kit.start("order", order_id="o-4", params=PARAMS)
    assert kit.status(saga_id) == "running"  # waiting for an answer: the clock has not moved

    step = kit.register(saga_id).steps[1]
    await kit.advance(step.answer_within_s + 1)  # the deadline: sent again (sends = default 3)
    assert [r.action for r in kit.requests(saga_id)].count("shop.charge") == 2
    for _ in range(2):
        await kit.advance(step.answer_within_s + 1)

    state = kit.register(saga_id)
    assert state.status == "compensated"
    assert state.steps[1].compensation_status == "compensated"
    refund = next(r for r in kit.requests(saga_id) if r.action == "shop.refund")
    assert refund.params == {"forward_key": f"{saga_id}:shop.charge"}  # no id came back


async def test_a_gate_waits_for_a_person_not_the_agent(kit: SagaKit) -> None:
    saga_id = await kit.start("approved_order", order_id="o-5", params=PARAMS)
    assert kit.status(saga_id) == "awaiting_approval"
    assert kit.deps("shop").sent == []

    with pytest.raises(PlanRejected, match="not_permitted"):
        await kit.approve(saga_id, by="agent-1", role="agent")
    with pytest.raises(CommandRejected, match="person"):
        await kit.approve(saga_id, by="ops-1", role="ops")  # this gate wants a person
    await kit.approve(saga_id, by="ana", note="the customer confirmed")

    assert kit.status(saga_id) == "completed"
    assert kit.deps("shop").sent == ["a@example.com"]


async def test_a_gate_times_out_into_compensation(kit: SagaKit) -> None:
    saga_id = await kit.start("approved_order", order_id="o-6", params=PARAMS)
    await kit.advance(3599)
    assert kit.status(saga_id) == "awaiting_approval"
    await kit.advance(2)

    assert kit.status(saga_id) == "compensated"
    assert kit.deps("shop").sent == []


async def test_a_failed_compensation_needs_a_human_and_resumes(kit: SagaKit) -> None:
    kit.fail("shop.notify", "permanent")
    kit.fail("shop.refund", "permanent")
    saga_id = await kit.start("order", order_id="o-7", params=PARAMS)
    assert kit.status(saga_id) == "needs_human"

    kit.clear_faults()
    await kit.resume(saga_id, note="the refund API is back")

    assert kit.status(saga_id) == "compensated"
    assert kit.deps("shop").refunded == ["c-1200"]


async def test_sagas_of_one_order_run_one_after_another(kit: SagaKit) -> None:
    kit.fail("shop.charge", "hang")
    first = await kit.start("order", order_id="o-8", params=PARAMS)
    second = await kit.start("order", order_id="o-8", params=PARAMS)
    assert (kit.status(first), kit.status(second)) == ("running", "waiting")

    kit.clear_faults()
    step = kit.register(first).steps[1]
    await kit.advance(step.answer_within_s + 1)  # the re-send is answered now

    assert (kit.status(first), kit.status(second)) == ("completed", "completed")


async def test_bad_params_are_refused_by_the_gateway(kit: SagaKit) -> None:
    with pytest.raises(PlanRejected, match="params"):
        await kit.start("order", order_id="o-9", params={**PARAMS, "amount_cents": "lots"})
    assert kit.calls == []
