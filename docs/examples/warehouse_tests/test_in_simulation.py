"""The warehouse's saga in the deterministic simulation (or on the real stack with
SAGA_TEST_STACK=real)."""

from __future__ import annotations

from saga_app.pytest_plugin import Sagas
from saga_app.simkit import SagaHarness


def test_a_thing_that_is_never_answered_for_is_undone(sagas: Sagas) -> None:
    async def scenario(s: SagaHarness) -> None:
        s.fail("warehouse.create_thing", "hang")  # also "permanent", "transient" with times=N
        saga_id = await s.start("warehouse_demo", order_id="o-1", params={"label": "crate"})
        await s.reaches(saga_id, "compensated", within=600)  # virtual seconds
        await s.published("saga.compensated", saga_id)

    sagas.run(scenario)
