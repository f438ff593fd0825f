"""A pytest plugin for testing one's sagas: the ``sagas`` fixture runs a scenario in the
deterministic simulation (``saga_app.simkit``), or on the real stack with
``SAGA_TEST_STACK=real``. In your ``conftest.py``::

    pytest_plugins = ["saga_app.pytest_plugin"]

    @pytest.fixture
    def saga_catalog() -> Path:
        return Path("my-catalog.toml")

    @pytest.fixture
    def saga_services() -> list[Service]:
        return [warehouse.SERVICE]

and in a test::

    def test_a_pick_that_hangs_is_undone(sagas: Sagas) -> None:
        async def scenario(s: SagaHarness) -> None:
            s.fail("warehouse.pick", "hang")
            saga_id = await s.start("pick_and_ship", order_id="o-1", params={...})
            await s.reaches(saga_id, "compensated", within=600)

        sagas.run(scenario)
"""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest

from saga_app.sim import loop
from saga_app.simkit import SagaHarness, Simulation, on_the_real_stack
from saga_services.sdk import Service
from saga_shared.config import Settings
from saga_shared.model.ids import seeded
from saga_shared.model.messages import stamped_by

T = TypeVar("T")
Scenario = Callable[[Any], Awaitable[T]]


class Sagas:
    """Runs scenarios of one's sagas: in the simulation, or on the real stack."""

    def __init__(self, catalog: Path, services: Sequence[Service[Any]], *, seed: int = 0,
                 real: bool | None = None) -> None:  # fmt: skip
        self.catalog = catalog
        self.services = services
        self.seed = seed
        self.real = os.environ.get("SAGA_TEST_STACK") == "real" if real is None else real

    def run(self, scenario: Callable[[SagaHarness], Awaitable[T]]) -> T:
        """Run ``scenario`` with a harness; the same seed gives the same run, event for event."""
        if self.real:
            return asyncio.run(self._on_the_stack(scenario))
        ids = random.Random(f"ids-{self.seed}")
        with seeded(ids.randbytes), stamped_by(loop.now):
            return loop.run(self._simulated(scenario))

    async def _simulated(self, scenario: Callable[[SagaHarness], Awaitable[T]]) -> T:
        async with Simulation(self.catalog, self.services, seed=self.seed) as harness:
            return await scenario(harness)

    async def _on_the_stack(self, scenario: Callable[[SagaHarness], Awaitable[T]]) -> T:
        async with on_the_real_stack(self.catalog, self.services) as harness:
            return await scenario(harness)


@pytest.fixture
def saga_catalog() -> Path:
    """Override with your catalog's path (default: ``SAGA_CATALOG_PATH``, else the shipped)."""
    return Path(os.environ.get("SAGA_CATALOG_PATH") or Settings().catalog_file)


@pytest.fixture
def saga_services() -> list[Service[Any]]:
    """Override with your services (the built-in simulated systems serve the rest)."""
    return []


@pytest.fixture
def sagas(saga_catalog: Path, saga_services: list[Service[Any]]) -> Sagas:
    return Sagas(saga_catalog, saga_services)
