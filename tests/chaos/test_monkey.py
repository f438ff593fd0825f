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
from tests.chaos.processes import Supervisor, _Running


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


async def test_a_process_being_killed_is_not_running_and_cannot_be_frozen(tmp_path: Any) -> None:
    """The real supervisor: between its SIGKILL and the reaping, the dying process is still
    listed. CI's seed 3403412754 drew erp for the freeze in that moment: the freeze stopped the
    dying process, the kill loop restarted erp, and the new one answered, so no deadline fired."""
    supervisor = Supervisor(env={}, log_dir=tmp_path, components={"erp": "erp"})
    proc = await asyncio.create_subprocess_exec("sleep", "30")
    supervisor._running["erp"] = _Running(proc, started=0.0)
    assert supervisor.is_running("erp")
    killing = asyncio.create_task(supervisor.kill("erp"))
    await asyncio.sleep(0)  # the SIGKILL is sent; the process is not reaped yet
    assert not supervisor.is_running("erp")
    assert not await supervisor.freeze("erp", 0.01)
    assert await killing
    assert supervisor.freezes == Counter()
