"""A misspelt status or field in a decision is a type error (mypy strict), not a saga that
silently stays where it was: statuses are Literal types and register updates go through
``evolve`` with typed keywords."""

from __future__ import annotations

from pathlib import Path

from mypy import api

PROBE = """
from __future__ import annotations

from datetime import datetime

from saga_coordinator.progress import finish
from saga_coordinator.register import SagaState, Step


def probe(state: SagaState, step: Step, now: datetime) -> None:
    finish(state, "complted", "saga.completed", now, [])
    step.evolve(stauts="done")
    state.evolve(status="runing")
    step.evolve(status="done", sends=2)  # the one right line
"""


def test_mypy_refuses_each_misspelling_and_accepts_the_right_update(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE, encoding="utf-8")
    out, _, code = api.run(["--strict", "--no-error-summary", str(probe)])
    errors = [line for line in out.splitlines() if ": error:" in line]
    assert code == 1
    assert [e.split(":")[1] for e in errors] == ["11", "12", "13"], out
    assert "complted" in errors[0] and "stauts" in errors[1] and "runing" in errors[2]
