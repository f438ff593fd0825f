"""The register's copies (``evolve``, ``with_step``) skip pydantic's generic ``model_copy``; what
they make must be what ``model_copy`` makes, and must leave the original as it was."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from saga_coordinator.register import SagaState
from tests.unit.factories import REFUND_PARAMS, Driver, real_catalog, start_named

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


def running() -> SagaState:
    driver = Driver(real_catalog())
    driver.feed(start_named("refund", REFUND_PARAMS, saga_id="saga-c"))
    return driver.st


def test_evolve_equals_model_copy_and_keeps_the_original() -> None:
    state = running()
    before = state.model_dump_json()

    mine = state.evolve(status="compensating", reason="the e-mail bounced", updated_at=NOW)
    theirs = state.model_copy(
        update={"status": "compensating", "reason": "the e-mail bounced", "updated_at": NOW}
    )

    assert mine == theirs
    assert mine.model_dump_json() == theirs.model_dump_json()
    assert mine.model_fields_set == theirs.model_fields_set
    assert state.model_dump_json() == before
    assert SagaState.model_validate_json(mine.model_dump_json()) == mine


def test_a_step_changed_in_a_copy_changes_only_the_copy() -> None:
    state = running()
    step = state.steps[0].evolve(status="done", result={"reservation_id": "r-1"}, attempts=1)

    mine = state.with_step(step, landed_count=1)
    theirs = state.model_copy(
        update={"landed_count": 1, "steps": (step, *state.steps[1:])}
    )  # fmt: skip

    assert mine == theirs
    assert mine.steps[0].status == "done" and state.steps[0].status == "running"
    assert step == state.steps[0].model_copy(
        update={"status": "done", "result": {"reservation_id": "r-1"}, "attempts": 1}
    )


def test_a_copy_is_frozen_like_the_original() -> None:
    copy = running().evolve(reason="x")
    with pytest.raises(ValidationError):
        copy.reason = "changed"  # type: ignore[misc]
    with pytest.raises(ValidationError):
        copy.steps[0].status = "done"  # type: ignore[misc]
