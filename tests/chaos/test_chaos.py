"""The CI chaos test: 1,000 sagas of both kinds with injected faults, while every process is
SIGKILLed at random (about every 1.5 s), the broker and the database are each restarted twice
(a crash, then a clean stop), an adapter hangs for 40 s (SIGSTOP: the coordinator's deadlines
fire) and a coordinator for 20 s (the other takes its partitions on), the agents abort some
sagas and, after the chaos, an operator resumes half the sagas in needs_human; then every rule
of the design (docs/explanation/design.md) is checked for every saga.
Sized to take about two minutes on a 2-core machine; the big version runs by hand:
``python -m tests.chaos --sagas 10000``.

On failure the message names the run directory: every process's log, the servers' logs, the load
and faults injected (load.json), every violation (violations.txt) and a dump of the final
database (saga.dump, ``pg_restore``) are kept there.
"""

from __future__ import annotations

import pytest

from tests.chaos.harness import ChaosConfig, ChaosResult, run_chaos
from tests.chaos.processes import COMPONENTS, EMBEDDED


@pytest.mark.timeout(900)
async def test_every_rule_holds_for_every_saga_under_chaos() -> None:
    config = ChaosConfig(
        sagas=1000,
        rate=12.0,  # the load lasts ~80 s: kills and restarts land while sagas arrive
        kill_every_s=1.5,
        kill_pause_s=2.0,
        broker_restarts=2,
        db_restarts=2,
        settle_timeout_s=240.0,
        freeze_coordinator_s=20.0,
    )
    result = await run_chaos(config)

    # The run really was chaotic: otherwise a green result would prove nothing.
    # Victims are drawn in shuffled rounds: each process is killed before any is killed twice.
    assert set(result.kills) == set(COMPONENTS), result.summary
    assert result.broker_restarts >= 2, result.summary
    assert result.db_restarts >= 2, result.summary
    assert sum(result.freezes.values()) == 2, result.summary
    assert sum(n for name, n in result.freezes.items() if "coordinator" in name) == 1
    assert result.verdict.handling["deadlines_fired"] > 0, result.summary
    assert result.publish.aborts > 0 and result.publish.resumes > 0, result.summary

    held(result)


@pytest.mark.timeout(900)
async def test_every_rule_holds_with_the_in_process_hand_off() -> None:
    """The same chaos on two `saga run all` processes with the in-process hand-off, each owning
    half the partitions: a kill takes a coordinator and its adapters with whatever they had
    handed each other, a freeze hangs both, and the starts and takeovers must send it again."""
    config = ChaosConfig(
        sagas=600,
        rate=12.0,
        kill_every_s=1.5,
        kill_pause_s=2.0,
        broker_restarts=1,
        db_restarts=1,
        settle_timeout_s=240.0,
        freeze_coordinator_s=20.0,
        embedded=True,
    )
    result = await run_chaos(config)

    assert set(result.kills) == set(EMBEDDED), result.summary
    assert result.broker_restarts >= 1 and result.db_restarts >= 1, result.summary
    assert sum(result.freezes.values()) == 1, result.summary  # no process runs adapters alone
    assert result.verdict.handling["requests_resent"] > 0, result.summary

    held(result)


def held(result: ChaosResult) -> None:
    """Every rule held for every saga, each published start confirmed and final."""
    assert result.publish.confirmed == result.config.sagas, result.summary
    assert result.settled, f"sagas still not final after the settle timeout\n{result.summary}"
    assert result.verdict.lost == 0, result.summary
    assert result.verdict.duplicated_effects == 0, result.summary
    assert result.verdict.dead_letters == 0, result.summary
    assert result.verdict.violations == [], result.summary
