"""The test harness a user runs over their own catalog and services: the deterministic simulation
by default (this file), the same scenarios on the real stack with ``SAGA_TEST_STACK=real``
(``tests/integration/test_simkit_real.py``)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from pydantic import BaseModel, JsonValue

from saga_app.pytest_plugin import Sagas
from saga_app.simkit import SagaHarness, Simulation
from saga_services.sdk import Call, KeyQuery, KeyStatus, Resources, Result, Service, Undo

CATALOG = """
[actions."warehouse.pick"]
class = "compensable"
compensation = "warehouse.unpick"
params = { sku = "str" }
result = ["pick_id"]
timeout_s = 2
retry = { attempts = 2, initial_backoff_s = 0.1, max_backoff_s = 1 }

[actions."warehouse.notify"]
class = "irreversible"
params = { sku = "str" }
timeout_s = 2
retry = { attempts = 2, initial_backoff_s = 0.1, max_backoff_s = 1 }

[actions."inventory.reserve_stock"]
class = "compensable"
compensation = "inventory.release_stock"
params = { sku = "str", quantity = "int" }
result = ["reservation_id"]
timeout_s = 2

[compensations."warehouse.unpick"]
timeout_s = 2

[compensations."inventory.release_stock"]
timeout_s = 2

[sagas.pick_and_ship]
steps = ["inventory.reserve_stock", "warehouse.pick", "warehouse.notify"]

[sagas.pick_and_ship.gates."warehouse.notify"]
timeout_s = 600
require_person = true
"""
PARAMS: dict[str, JsonValue] = {"sku": "SKU-1", "quantity": 1}


class Shelf:
    """The user's system: picks by idempotency key, notices sent by key."""

    def __init__(self) -> None:
        self.picks: dict[str, str] = {}
        self.notices: dict[str, str] = {}


class Pick(BaseModel):
    sku: str


class Unpick(Undo):
    pick_id: str | None = None


def warehouse() -> Service[Shelf]:
    shelf = Shelf()

    @contextlib.asynccontextmanager
    async def setup(resources: Resources) -> AsyncIterator[Shelf]:
        yield shelf

    async def status(query: KeyQuery, system: Shelf) -> KeyStatus:
        done = system.notices.get(query.key) or system.picks.get(query.key)
        return KeyStatus("done", result={"id": done}) if done else KeyStatus("unknown")

    service: Service[Shelf] = Service("warehouse", setup=setup, status=status)

    @service.action("warehouse.pick")
    async def pick(call: Call[Pick, Shelf]) -> Result:
        return {"pick_id": call.deps.picks.setdefault(call.key, f"pick-{len(call.deps.picks)}")}

    @service.compensation("warehouse.unpick")
    async def unpick(call: Call[Unpick, Shelf]) -> Result:
        target = call.params.target("pick_id")
        return {"unpicked": call.deps.picks.pop(str(target.get("forward_key")), None) is not None}

    @service.action("warehouse.notify")
    async def notify(call: Call[Pick, Shelf]) -> Result:
        call.deps.notices.setdefault(call.key, f"notice-{len(call.deps.notices)}")
        return {}

    return service


@pytest.fixture
def sagas(tmp_path: Path) -> Sagas:
    path = tmp_path / "catalog.toml"
    path.write_text(CATALOG)
    return Sagas(path, [warehouse()], real=False)


def test_a_saga_with_a_gate_completes_and_its_events_are_published(sagas: Sagas) -> None:
    async def scenario(s: SagaHarness) -> list[str]:
        saga_id = await s.start("pick_and_ship", order_id="o-1", params=PARAMS)
        await s.reaches(saga_id, "awaiting_approval")
        await s.approve(saga_id, note="looks right")
        state = await s.reaches(saga_id, "completed")
        await s.published("saga.completed", saga_id)
        return [step.status for step in state.steps]

    assert sagas.run(scenario) == ["done", "done", "done"]


def test_a_pick_that_never_answers_is_undone_by_its_key(sagas: Sagas) -> None:
    async def scenario(s: SagaHarness) -> str:
        s.fail("warehouse.pick", "hang")
        saga_id = await s.start("pick_and_ship", order_id="o-2", params=PARAMS)
        state = await s.reaches(saga_id, "compensated", within=600)  # a virtual hour is free
        return state.steps[1].compensation_status

    assert sagas.run(scenario) == "compensated"


def test_the_adapter_killed_and_the_broker_crashing_change_no_outcome(sagas: Sagas) -> None:
    async def scenario(s: SagaHarness) -> str:
        assert isinstance(s, Simulation)
        saga_id = await s.start("pick_and_ship", order_id="o-3", params=PARAMS)
        s.crash("warehouse-0", for_s=3.0)
        s.crash_broker(for_s=2.0)
        await s.reaches(saga_id, "awaiting_approval", within=300)
        await s.approve(saga_id)
        return (await s.reaches(saga_id, ("completed", "compensated"), within=300)).status

    assert sagas.run(scenario) == "completed"


def test_an_assertion_that_never_holds_says_where_the_saga_is(sagas: Sagas) -> None:
    async def scenario(s: SagaHarness) -> None:
        saga_id = await s.start("pick_and_ship", order_id="o-4", params=PARAMS)
        await s.reaches(saga_id, "completed", within=30)  # it waits at its gate

    with pytest.raises(AssertionError, match=r"never reached.*awaiting_approval"):
        sagas.run(scenario)


def test_the_same_seed_runs_the_same_way(tmp_path: Path) -> None:
    path = tmp_path / "catalog.toml"
    path.write_text(CATALOG)

    async def scenario(s: SagaHarness) -> list[tuple[str, str]]:
        assert isinstance(s, Simulation)
        saga_id = await s.start("pick_and_ship", order_id="o-5", params=PARAMS, saga_id="s-5")
        s.crash("coordinator-0", for_s=1.0)
        await s.reaches(saga_id, "awaiting_approval", within=300)
        return [(e.type, str(e.timestamp)) for e in s.events]

    first = Sagas(path, [warehouse()], seed=7, real=False).run(scenario)
    again = Sagas(path, [warehouse()], seed=7, real=False).run(scenario)
    assert first == again and first
