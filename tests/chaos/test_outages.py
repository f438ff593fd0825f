"""Outages under load, on a disposable broker and database with the real processes running:
Postgres stopped for 10 s, and the broker restarted (a clean stop, and a crash). No process is
killed and no fault injected, so every saga must complete, nothing may be dead-lettered, and no
process may die of the outage (issue 4, item 3: held and retried, reconnected by themselves).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from tests.chaos.harness import ChaosConfig, ChaosResult, ChaosSystem, Disruption, run_chaos

SAGAS = 300
RATE = 15.0  # the load lasts 20 s; the outage starts 5 s in, while sagas keep arriving
OUTAGE_AT_S = 5.0


def quiet_config(outage: Disruption) -> ChaosConfig:
    return ChaosConfig(
        sagas=SAGAS,
        rate=RATE,
        kill_every_s=None,
        broker_restarts=0,
        db_restarts=0,
        chaos_tail_s=0.0,
        settle_timeout_s=180.0,
        with_faults=False,
        freeze_s=0.0,
        disruption=outage,
    )


def assert_everything_finished(result: ChaosResult) -> None:
    assert result.publish.confirmed == SAGAS, result.summary
    assert result.settled, f"sagas still not final after the settle timeout\n{result.summary}"
    assert result.verdict.dead_letters == 0, result.summary
    assert result.verdict.terminal == {"completed": SAGAS}, result.summary
    assert result.verdict.violations == [], result.summary
    exits = [f"{e.name} (code {e.returncode}): {e.log_tail}" for e in result.process_exits]
    assert exits == [], "a process died of the outage:\n" + "\n".join(exits)


@pytest.mark.timeout(600)
async def test_postgres_stopped_for_10s_under_load_nothing_dead_lettered() -> None:
    async def stop_postgres_10s(system: ChaosSystem, log: Callable[[str], None]) -> None:
        await asyncio.sleep(OUTAGE_AT_S)
        log("postgres: stop (fast) for 10 s")
        await system.pg.stop()
        await asyncio.sleep(10)
        await system.pg.start()
        log("postgres: back")

    result = await run_chaos(quiet_config(stop_postgres_10s))

    assert result.db_restarts == 1, result.summary
    assert_everything_finished(result)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("crash", [False, True], ids=["clean-stop", "sigkill"])
async def test_broker_restarted_under_load_everything_finishes(crash: bool) -> None:
    async def restart_broker(system: ChaosSystem, log: Callable[[str], None]) -> None:
        await asyncio.sleep(OUTAGE_AT_S)
        log(f"rabbitmq: {'crash (SIGKILL)' if crash else 'clean stop'}, start again at once")
        await system.restart_broker(crash=crash, down_s=0.0)
        log("rabbitmq: back")

    result = await run_chaos(quiet_config(restart_broker))

    assert result.broker_restarts == 1, result.summary
    assert_everything_finished(result)
