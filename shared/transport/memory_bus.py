"""The in-memory twin of the bus's routing: the exchanges, bindings and queues the topology
declares, as dicts. The test kit publishes through it; ``tests/twins/test_bus_contract.py``
routes the same messages through RabbitMQ and through it and expects the same queues to hold
them. It has no consumers, acks, redeliveries or dead-lettering: those are the broker's, and
the integration tests exercise them on the real one."""

from __future__ import annotations

from collections import deque
from itertools import count

from saga_shared.errors import SagaError
from saga_shared.model.messages import Outbound
from saga_shared.transport.ports import Publisher
from saga_shared.transport.topology import Topology


class Unroutable(SagaError):
    """A work message (a partition's, an action's) reached no queue."""


def topic_matches(pattern: str, key: str) -> bool:
    """AMQP topic matching: ``*`` is one word, ``#`` zero or more."""

    def match(p: list[str], k: list[str]) -> bool:
        if not p:
            return not k
        if p[0] == "#":
            return any(match(p[1:], k[i:]) for i in range(len(k) + 1))
        return bool(k) and p[0] in ("*", k[0]) and match(p[1:], k[1:])

    return match(pattern.split("."), key.split("."))


class MemoryBus:
    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self.queues: dict[str, deque[tuple[int, str, bytes]]] = {
            q: deque() for q in topology.all_queues()
        }
        self._bindings = topology.bindings()
        self._seq = count()
        t = topology
        self._topics = {t.commands_exchange, t.events_exchange}
        self._mandatory = {
            t.partitions_exchange, t.outcomes_exchange, t.actions_exchange, t.commands_exchange
        }  # fmt: skip
        self._alternates = t.alternates()

    def lose(self, queue: str) -> None:
        """A non-durable queue gone with its node: its messages and bindings."""
        self.queues.pop(queue, None)
        self._bindings = [b for b in self._bindings if b[2] != queue]

    def bind(self, queue: str, exchange: str, pattern: str) -> None:
        """A client's own queue (replies, events), as ``queue_declare`` + ``queue_bind``."""
        self.queues.setdefault(queue, deque())
        self._bindings.append((exchange, pattern, queue))

    def route(self, exchange: str, routing_key: str) -> list[str]:
        if exchange == "":
            return [routing_key] if routing_key in self.queues else []
        if exchange == self.topology.dead_letter_exchange:  # fanout
            return [q for e, _, q in self._bindings if e == exchange]
        matches = topic_matches if exchange in self._topics else str.__eq__
        bound = (q for e, k, q in self._bindings if e == exchange and matches(k, routing_key))
        found = sorted(set(bound))
        if not found and exchange in self._alternates:
            return self.route(self._alternates[exchange], routing_key)
        return found

    async def publish(self, exchange: str, routing_key: str, message: Outbound) -> None:
        self.publish_body(exchange, routing_key, message.type, message.model_dump_json().encode())

    def publish_body(self, exchange: str, routing_key: str, kind: str, body: bytes) -> None:
        targets = self.route(exchange, routing_key)
        if not targets and exchange in self._mandatory:
            where = exchange or "the default exchange"
            raise Unroutable(f"{kind} to {where} under {routing_key!r} reached no queue")
        seq = next(self._seq)
        for queue in targets:
            self.queues[queue].append((seq, kind, body))

    def depth(self, queue: str) -> int:
        return len(self.queues.get(queue, ()))

    def next(self, queues: set[str]) -> tuple[str, bytes] | None:
        """The oldest message waiting in any of ``queues`` (removed), in publish order."""
        waiting = [(self.queues[q][0][0], q) for q in queues if self.queues.get(q)]
        if not waiting:
            return None
        _, queue = min(waiting)
        _, _, body = self.queues[queue].popleft()
        return queue, body


def _is_a_publisher(bus: MemoryBus) -> Publisher:
    return bus  # mypy checks here that the twin has the interface
