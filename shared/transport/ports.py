"""The narrow interface of the bus for what publishes: RabbitMQ (``saga_shared.transport.bus.Bus``,
every message confirmed) and the in-memory twin (``saga_shared.transport.memory_bus.MemoryBus``)
implement it, and ``tests/twins/test_bus_contract.py`` routes the same messages through both."""

from __future__ import annotations

from typing import Protocol

from saga_shared.model.messages import Outbound
from saga_shared.transport.topology import Topology


class Publisher(Protocol):
    topology: Topology

    async def publish(self, exchange: str, routing_key: str, message: Outbound) -> None:
        """Route ``message`` by the topology's bindings; a work message (to the partitions,
        the actions, the commands) that reaches no queue raises."""
