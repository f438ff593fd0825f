"""The Health page's figures, from the processes' heartbeats (``processes``) and the queues'
depths (a passive declare each): which processes are alive, which went silent, what each
receives per second, and per queue how much waits and how long it would take to drain.

Pure: rows and depths in, figures out; ``reads`` and ``pages`` do the I/O."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from saga_shared.transport.bus import QueueDepth
from saga_shared.transport.topology import Topology

State = Literal["alive", "silent", "stopped"]


@dataclass(frozen=True)
class Process:
    id: str
    kind: str
    name: str
    host: str
    pid: int
    version: str
    started_at: datetime
    beat_at: datetime
    state: State
    quiet_s: float  # since its last beat
    per_s: dict[str, float]  # deliveries a second per queue, between its last two beats
    received: dict[str, int]  # deliveries per queue since it started
    partitions: tuple[int, ...]  # a coordinator's: those it held the locks of at its last beat


@dataclass(frozen=True)
class Queue:
    name: str
    kind: str
    messages: int | None  # None: the broker did not say (the queue is missing, or no broker)
    consumers: int | None
    per_s: float  # summed over the processes alive
    drain_s: float | None  # at that rate; None when nothing waits or nothing drains it


@dataclass(frozen=True)
class Health:
    processes: tuple[Process, ...]
    queues: tuple[Queue, ...]
    silent_after_s: float

    @property
    def silent(self) -> int:
        return sum(p.state == "silent" for p in self.processes)


def _counts(value: Any) -> dict[str, int]:
    raw = json.loads(value) if isinstance(value, str) else (value or {})
    return {str(k): int(v) for k, v in raw.items() if isinstance(v, int)}


def process_of(row: dict[str, Any], silent_after_s: float) -> Process:
    quiet_s = float(row["quiet_s"])
    state: State = (
        "stopped" if row["stopped_at"] else "alive" if quiet_s <= silent_after_s else "silent"
    )
    now, before = _counts(row["queues"]), _counts(row["before"])
    span = (row["beat_at"] - row["before_at"]).total_seconds() if row["before_at"] else 0.0
    per_s = {q: (n - before.get(q, 0)) / span for q, n in now.items() if span > 0}
    per_s = {q: r for q, r in per_s.items() if r >= 0}  # a restarted count is no rate
    # A stopped process's lock session ended with it; a silent one's may still hold its locks
    # (frozen) until the lease passes them on, and the row says so by its state.
    partitions = () if state == "stopped" else tuple(sorted(row.get("partitions") or ()))
    return Process(
        row["id"], row["kind"], row["name"], row["host"], row["pid"], row["version"],
        row["started_at"], row["beat_at"], state, quiet_s,
        per_s if state == "alive" else {}, now, partitions,
    )  # fmt: skip


def health(
    rows: list[dict[str, Any]],
    depths: dict[str, QueueDepth | None],
    topology: Topology,
    silent_after_s: float,
) -> Health:
    processes = tuple(process_of(r, silent_after_s) for r in rows)
    queues = []
    for name in topology.all_queues():
        depth = depths.get(name)
        rate = sum(p.per_s.get(name, 0.0) for p in processes)
        waiting = depth.messages if depth else None
        drain = waiting / rate if waiting and rate > 0 else None
        queues.append(Queue(
            name, topology.kind_of(name)[0], waiting, depth.consumers if depth else None,
            rate, drain,
        ))  # fmt: skip
    return Health(processes, tuple(queues), silent_after_s)
