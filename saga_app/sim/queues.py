"""The simulated broker's queues, exchanges and bindings, configured from the very AMQP arguments
``Topology.declare`` gives RabbitMQ (so a change there changes the simulation too), and the
headers RabbitMQ writes on a message it dead-letters."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection, Iterable
from datetime import datetime
from typing import Any, Generic, Protocol, TypeVar

from saga_app.sim.messages import Stored
from saga_shared.transport.memory_bus import topic_matches
from saga_shared.transport.topology import Topology


class Taker(Protocol):
    @property
    def has_room(self) -> bool: ...


C = TypeVar("C", bound=Taker)


class SimQueue(Generic[C]):
    """FIFO, but a message given back (requeued, or in hand of a consumer that went away) goes
    before every message not yet delivered, as a quorum queue's returns do: the later ones
    wait behind it."""

    def __init__(
        self,
        name: str,
        arguments: dict[str, Any],
        *,
        durable: bool = True,
        owner: object | None = None,
        default_limit: int | None = None,
    ) -> None:
        self.name = name
        self.durable = durable
        self.owner = owner  # the connection an exclusive queue lives and dies with
        self.kind = str(arguments.get("x-queue-type", "classic"))
        self.single_active = bool(arguments.get("x-single-active-consumer"))
        limit = arguments.get("x-delivery-limit")
        # RabbitMQ 4.0 gives a quorum queue a limit of 20 when none is set; classic: none.
        self.delivery_limit: int | None = (
            int(limit) if limit is not None else default_limit if self.kind == "quorum" else None
        )
        self.dead_letter_exchange: str | None = arguments.get("x-dead-letter-exchange")
        self.ready: deque[Stored] = deque()
        self.returns: deque[Stored] = deque()
        self.consumers: list[C] = []  # in the order they subscribed
        self._turn = 0

    def __len__(self) -> int:
        return len(self.returns) + len(self.ready)

    def put(self, stored: Stored) -> None:
        self.ready.append(stored)

    def give_back(self, stored: Stored) -> None:
        self.returns.append(stored)

    def take(self) -> Stored:
        return self.returns.popleft() if self.returns else self.ready.popleft()

    def keep_only(self, keep: Callable[[Stored], bool]) -> list[Stored]:
        """Drop the waiting messages ``keep`` refuses (asked in queue order); those dropped."""
        dropped: list[Stored] = []
        for line in (self.returns, self.ready):
            kept: list[Stored] = []
            for stored in line:
                (kept if keep(stored) else dropped).append(stored)
            line.clear()
            line.extend(kept)
        return dropped

    def pick(self) -> C | None:
        """The consumer the next message goes to: with a single active consumer the oldest
        subscriber, or nobody while it has no room; otherwise round robin among those with
        room."""
        if self.single_active:
            active = self.consumers[0] if self.consumers else None
            return active if active is not None and active.has_room else None
        n = len(self.consumers)
        for step in range(n):
            i = (self._turn + step) % n
            if self.consumers[i].has_room:
                self._turn = i + 1
                return self.consumers[i]
        return None


def exchanges_of(topology: Topology) -> dict[str, str]:
    """Each exchange and its kind, as ``Topology.declare`` declares them."""
    t = topology
    return {
        t.commands_exchange: "topic",
        t.partitions_exchange: "direct",
        t.outcomes_exchange: "direct",
        t.actions_exchange: "direct",
        t.events_exchange: "topic",
        t.dead_letter_exchange: "fanout",
    }


def queues_of(topology: Topology) -> list[tuple[str, dict[str, Any], bool]]:
    """Each queue of the topology, the arguments ``Topology.declare`` declares it with, and
    whether it is durable (the request queues are not)."""
    out = []
    for name in topology.all_queues():
        kind, _ = topology.kind_of(name)
        if topology.is_request_queue(name):
            out.append((name, topology.request_queue_args(), False))
            continue
        if topology.is_outcome_queue(name):
            out.append((name, topology.outcome_queue_args(), False))
            continue
        if kind in ("intake", "partition", "action"):
            args = topology._work_queue_args(single_active=kind != "action")
        else:
            args = topology._quorum_args()
        out.append((name, args, True))
    return out


class Router:
    """Exchanges and bindings. Routes are cached per (exchange, key) until a binding changes:
    every message crosses here, and a topic match walks every binding."""

    def __init__(
        self, kinds: dict[str, str], bindings: Iterable[tuple[str, str, str]],
        alternates: dict[str, str] | None = None,
    ) -> None:  # fmt: skip
        self.kinds = dict(kinds)
        self.alternates = dict(alternates or {})  # what an exchange cannot route goes there
        self.bindings = list(bindings)  # (exchange, pattern, queue), in declaration order
        self._routes: dict[tuple[str, str], list[str]] = {}

    def knows(self, exchange: str) -> bool:
        return exchange == "" or exchange in self.kinds

    def bind(self, queue: str, exchange: str, pattern: str) -> None:
        if (exchange, pattern, queue) not in self.bindings:
            self.bindings.append((exchange, pattern, queue))
            self._routes.clear()

    def forget(self, queue: str) -> None:
        self.bindings = [b for b in self.bindings if b[2] != queue]
        self._routes.clear()

    def route(self, exchange: str, key: str, queues: Collection[str]) -> list[str]:
        """The queues a publish reaches, each once, in the order they were bound."""
        if exchange == "":
            return [key] if key in queues else []
        found = self._routes.get((exchange, key))
        if found is None:
            found = self._routes[(exchange, key)] = self._match(exchange, key)
        if not found and exchange in self.alternates:
            return self.route(self.alternates[exchange], key, queues)
        return found

    def _match(self, exchange: str, key: str) -> list[str]:
        kind = self.kinds.get(exchange)
        out: list[str] = []
        for bound, pattern, queue in self.bindings:
            if bound != exchange or queue in out:
                continue
            if kind == "fanout" or (
                topic_matches(pattern, key) if kind == "topic" else pattern == key
            ):
                out.append(queue)
        return out


def death_headers(
    stored: Stored, queue: str, reason: str, when: datetime, exchange: str
) -> dict[str, Any]:
    """The headers of ``stored`` dead-lettered from ``queue``: an ``x-death`` entry per
    (queue, reason), newest first, its count raised when it dies the same way again; the
    first death's queue, reason and exchange kept; the last one's (3.13) updated."""
    headers = dict(stored.headers)
    deaths = [dict(d) for d in headers.get("x-death") or [] if isinstance(d, dict)]
    same = next((d for d in deaths if d.get("queue") == queue and d.get("reason") == reason), None)
    if same is not None:
        deaths.remove(same)
        same["count"] = int(same.get("count", 0)) + 1
        same["time"] = when
        entry = same
    else:
        entry = {
            "count": 1,
            "reason": reason,
            "queue": queue,
            "time": when,
            "exchange": exchange,
            "routing-keys": [stored.routing_key],
        }
    headers["x-death"] = [entry, *deaths]
    first = {"reason": reason, "queue": queue, "exchange": exchange}
    for field, value in first.items():
        headers.setdefault(f"x-first-death-{field}", value)
        headers[f"x-last-death-{field}"] = value
    return headers
