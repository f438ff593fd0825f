"""The chaos monkey: SIGKILLs the system's processes now and then, freezes one adapter once
(SIGSTOP) and, when asked, one coordinator, and restarts the broker and the database at planned
instants."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from saga_shared.config import Settings
from saga_shared.model.catalog import Catalog, answer_within_s, service_of
from saga_shared.model.gateway import load_catalog

if TYPE_CHECKING:
    from tests.chaos.harness import ChaosConfig, ChaosSystem

Say = Callable[[str], None]
# A broker crash right after the queues were declared can lose them (RabbitMQ 3.10 keeps the
# quorum queues' directory in a dets file flushed lazily; seen here): let the topology settle.
MIN_UPTIME_BEFORE_BROKER_CRASH_S = 10.0
# A killed adapter is back within the kill pause (2 s by default); the freeze waits this long.
FREEZE_WAIT_S = 30.0
# The frozen adapter hangs this much longer than its longest answer window.
FREEZE_MARGIN_S = 6.0


@functools.cache
def chaos_catalog() -> Catalog:
    """The catalog the chaos system runs (the configured one), read once."""
    return load_catalog(Settings().catalog_file)


def longest_answer_window_s(service: str) -> float:
    """The longest time the coordinator waits for an answer from ``service`` before it sends
    a request again (``saga_shared.model.catalog.answer_within_s``), over its actions and
    compensations."""
    catalog = chaos_catalog()
    windows = [
        *((n, answer_within_s(a.timeout_s, a.retry)) for n, a in catalog.actions.items()),
        *((n, answer_within_s(c.timeout_s, c.retry)) for n, c in catalog.compensations.items()),
    ]
    return max((w for name, w in windows if service_of(name) == service), default=0.0)


@dataclass
class Monkey:
    """SIGKILLs a process now and then (restarting it after a short pause), and restarts the
    broker and the database at planned instants. Victims are drawn in shuffled rounds, so every
    component is killed once before any is killed twice."""

    system: ChaosSystem
    config: ChaosConfig
    rng: random.Random
    say: Say
    t0: float = field(default_factory=time.monotonic)
    _round: list[str] = field(default_factory=list)
    _frozen: set[str] = field(default_factory=set)
    frozen_s: dict[str, float] = field(default_factory=dict)  # how long each frozen one hung

    def log(self, text: str) -> None:
        self.say(f"[{time.monotonic() - self.t0:7.1f}s] {text}")

    def _victim(self) -> str:
        if not self._round:
            self._round = sorted(self.system.supervisor.components)
            self.rng.shuffle(self._round)
        return self._round.pop()

    async def kill_loop(self, stop: asyncio.Event) -> None:
        every = self.config.kill_every_s
        if every is None:
            return
        while not stop.is_set():
            wait = min(self.rng.expovariate(1 / every), 3 * every)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), wait)
                return
            name = self._victim()
            if name in self._frozen:
                continue  # a kill would end its hang: the restarted process answers at once
            if not await self.system.supervisor.kill(name):
                continue  # down already (it exited and waits for its restart)
            pause = self.rng.uniform(0, self.config.kill_pause_s)
            self.log(f"SIGKILL {name}; restart in {pause:.1f}s")
            await asyncio.sleep(pause)
            await self.system.supervisor.start(name)

    def outage_plan(self, window_s: float) -> list[tuple[float, str]]:
        """When to restart what: spread over the load window, broker and database apart."""
        plan = []
        for k in range(self.config.broker_restarts):
            at = window_s * (k + 0.2 + 0.3 * self.rng.random()) / self.config.broker_restarts
            plan.append((max(at, MIN_UPTIME_BEFORE_BROKER_CRASH_S), "broker"))
        for k in range(self.config.db_restarts):
            at = window_s * (k + 0.6 + 0.3 * self.rng.random()) / self.config.db_restarts
            plan.append((at, "database"))
        return sorted(plan)

    async def freeze(self, window_s: float) -> None:
        if self.config.freeze_s <= 0:
            return
        await asyncio.sleep(window_s * (0.3 + 0.2 * self.rng.random()))
        adapters = sorted(n for n in self.system.supervisor.components if "coordinator" not in n)
        if not adapters:  # embedded: the coordinator's freeze hangs its adapters too
            self.log("no freeze: no process runs adapters alone")
            return
        name = self.rng.choice(adapters)
        # A freeze shorter than the victim's answer windows fires no deadline (one of payments,
        # whose windows are 43.5 and 54 s, once left a CI run's deadlines untested).
        hang = max(self.config.freeze_s, longest_answer_window_s(name) + FREEZE_MARGIN_S)
        # The kill loop may have just killed the victim (CI's seed 2865351992 drew payments 0.1 s
        # after its SIGKILL, so nothing froze): wait for its restart. No await separates the
        # check from the SIGSTOP, so the kill loop cannot slip in between.
        if not await self._until_running(name):
            self.log(f"no freeze: {name} did not come back within {FREEZE_WAIT_S:.0f}s")
            return
        self.log(f"SIGSTOP {name} for {hang:.0f}s (it hangs; deadlines fire)")
        self._frozen.add(name)
        self.frozen_s[name] = hang
        try:
            if await self.system.supervisor.freeze(name, hang):
                self.log(f"SIGCONT {name}")
        finally:
            self._frozen.discard(name)

    async def freeze_coordinator(self, window_s: float) -> None:
        """One coordinator frozen (SIGSTOP) for ``freeze_coordinator_s`` in the middle of the
        load: its partitions must pass to the other, and the sagas of both go on."""
        if self.config.freeze_coordinator_s <= 0:
            return
        await asyncio.sleep(window_s * (0.2 + 0.2 * self.rng.random()))
        name = self.rng.choice(sorted(n for n in self.system.supervisor.components
                                      if "coordinator" in n))  # fmt: skip
        if not await self._until_running(name):
            self.log(f"no freeze: {name} did not come back within {FREEZE_WAIT_S:.0f}s")
            return
        self.log(f"SIGSTOP {name} for {self.config.freeze_coordinator_s:.0f}s")
        self._frozen.add(name)
        self.frozen_s[name] = self.config.freeze_coordinator_s
        try:
            if await self.system.supervisor.freeze(name, self.config.freeze_coordinator_s):
                self.log(f"SIGCONT {name}")
        finally:
            self._frozen.discard(name)

    async def _until_running(self, name: str) -> bool:
        deadline = time.monotonic() + FREEZE_WAIT_S
        while not self.system.supervisor.is_running(name):
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.05)
        return True

    async def outages(self, window_s: float) -> None:
        done: Counter[str] = Counter()
        for at, what in self.outage_plan(window_s):
            delay = self.t0 + at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            # Per server, a crash first, then a clean stop, alternating.
            crash = done[what] % 2 == 0
            done[what] += 1
            await (self._broker(crash) if what == "broker" else self._database(crash))

    async def _broker(self, crash: bool) -> None:
        down = self.config.broker_down_s * self.rng.uniform(0.5, 1.0)
        self.log(f"broker {'crash (SIGKILL)' if crash else 'stop'}; start in {down:.1f}s")
        started = time.monotonic()
        await self.system.restart_broker(crash=crash, down_s=down)
        self.log(f"broker back after {time.monotonic() - started:.1f}s")

    async def _database(self, crash: bool) -> None:
        down = self.config.db_down_s * self.rng.uniform(0.5, 1.0)
        self.log(
            f"database {'crash (immediate)' if crash else 'stop (fast)'}; start in {down:.1f}s"
        )
        started = time.monotonic()
        await self.system.restart_database(crash=crash, down_s=down)
        self.log(f"database back after {time.monotonic() - started:.1f}s")
