"""The monkey's freeze must land even when the adapter it draws was killed a moment before.

CI's chaos run with seed 2865351992 drew payments for the freeze 0.1 s after the kill loop had
SIGKILLed it: nothing was frozen, no deadline fired, and the run's "one freeze" check failed.
Here a supervisor stands in for the real one (the real one spawns the whole system), so the
order of kill, restart and freeze is exact.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, cast

from tests.chaos import monkey as monkey_module
from tests.chaos.harness import ChaosConfig
from tests.chaos.monkey import Monkey


@dataclass
class _Supervisor:
    components: list[str]
    down: set[str] = field(default_factory=set)
    freezes: Counter[str] = field(default_factory=Counter)

    def is_running(self, name: str) -> bool:
        return name not in self.down

    async def freeze(self, name: str, seconds: float) -> bool:
        if name in self.down:
            return False
        self.freezes[name] += 1
        return True


@dataclass
class _System:
    supervisor: _Supervisor


def _monkey(supervisor: _Supervisor) -> Monkey:
    config = ChaosConfig(sagas=1, freeze_s=0.01)
    return Monkey(cast(Any, _System(supervisor)), config, random.Random(1), lambda _: None)


async def test_a_freeze_drawn_while_its_victim_restarts_waits_and_freezes_it() -> None:
    supervisor = _Supervisor(["payments"], down={"payments"})
    freezing = asyncio.create_task(_monkey(supervisor).freeze(window_s=0.0))
    await asyncio.sleep(0.2)
    assert not supervisor.freezes, "froze a process that was not running"
    supervisor.down.clear()  # the kill loop's restart
    await asyncio.wait_for(freezing, 5)
    assert supervisor.freezes == Counter({"payments": 1})


async def test_a_victim_that_never_comes_back_ends_the_freeze_without_one(
    monkeypatch: Any,
) -> None:
    monkeypatch.setattr(monkey_module, "FREEZE_WAIT_S", 0.2)
    supervisor = _Supervisor(["payments"], down={"payments"})
    await asyncio.wait_for(_monkey(supervisor).freeze(window_s=0.0), 5)
    assert not supervisor.freezes
