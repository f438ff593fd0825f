"""A whole stack (intake, coordinator, relay, four adapters) per test, on the real RabbitMQ and
Postgres, in its own namespace of queues; an agent client beside it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from saga_coordinator.app import Stack
from shared.bus import Bus
from shared.client import SagaClient
from shared.config import Settings
from tests.integration.helpers import remove_namespace


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
    async with Bus(settings) as bus, SagaClient(bus, reply_timeout_s=20) as agent:
        yield agent
