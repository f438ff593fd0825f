"""The narrow interface of the bus for what publishes: RabbitMQ (``shared.bus.Bus``, every
message confirmed) and the in-memory twin (``shared.memory_bus.MemoryBus``) implement it, and
``tests/integration/test_bus_contract.py`` routes the same messages through both."""

from __future__ import annotations

from typing import Protocol

from shared.messages import Outbound
from shared.topology import Topology


class Publisher(Protocol):
    topology: Topology

    async def publish(self, exchange: str, routing_key: str, message: Outbound) -> None:
        """Route ``message`` by the topology's bindings; a work message (to the partitions,
        the actions, the commands) that reaches no queue raises."""
