"""A whole stack (intake, coordinator, relay, four adapters) per test, on the real RabbitMQ and
Postgres, in its own namespace of queues; an agent client beside it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest

from saga_app.stack import Stack
from saga_coordinator.processor import Processor
from saga_shared.client import SagaClient
from saga_shared.config import Settings
from saga_shared.model.catalog import Catalog
from saga_shared.model.gateway import load_catalog
from saga_shared.transport.bus import Bus
from tests.conftest import AMQP_URL

# The browser tests' fixtures (headless Chromium on a console over a stack).
from tests.integration.browser import agent, browser, console_stack, page, role_console  # noqa: F401
from tests.integration.deployment import Deployment
from tests.integration.helpers import forget_outbox, remove_namespace
from tests.integration.sabotage import Sabotage


@pytest.fixture
def sabotage(monkeypatch: pytest.MonkeyPatch) -> Sabotage:
    """The coordinator's handler raises for the sagas chosen (``sabotage.always(saga_id)``)."""
    saboteur = Sabotage()
    monkeypatch.setattr(Processor, "_handle", saboteur.wrap(Processor._handle))
    return saboteur


@pytest.fixture
def catalog(settings: Settings) -> Catalog:
    return load_catalog(settings.catalog_file)


@pytest.fixture
async def bus(settings: Settings) -> AsyncIterator[Bus]:
    """A broker connection with this test's topology declared; removed afterwards."""
    async with Bus(settings) as connected:
        await connected.declare()
        yield connected
    await remove_namespace(settings)


@pytest.fixture
async def stack(settings: Settings) -> AsyncIterator[Stack]:
    running = Stack(settings)
    await running.start()
    try:
        yield running
    finally:
        await running.stop()
        await remove_namespace(settings)


@pytest.fixture
async def client(stack: Stack, settings: Settings) -> AsyncIterator[SagaClient]:
    async with Bus(settings) as bus, SagaClient(bus, answer_within_s=20) as connected:
        yield connected


@pytest.fixture(scope="session")
def deployment(database_url: str, run_id: str) -> Iterator[Deployment]:
    """Every role on its own broker user and Postgres role (made by `saga setup`'s code), in a
    vhost of its own; removed at the end of the run."""
    base = Settings(amqp_url=AMQP_URL, database_url=database_url, partitions=4, watchdog_s=0.3)
    made = Deployment(base, run_id)
    asyncio.run(made.create())
    try:
        yield made
    finally:
        asyncio.run(made.remove())


@pytest.fixture
async def role_settings(deployment: Deployment) -> AsyncIterator[Settings]:
    yield deployment.settings.with_(relay_poll_s=0.2)
    await forget_outbox(deployment.settings)
    await deployment.purge()


@pytest.fixture
async def role_stack(role_settings: Settings) -> AsyncIterator[Stack]:
    running = Stack(role_settings)
    await running.start()
    try:
        yield running
    finally:
        await running.stop()
