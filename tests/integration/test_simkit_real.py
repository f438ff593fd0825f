"""The users' test harness with ``SAGA_TEST_STACK=real``: the scenarios of
``tests/unit/test_simkit.py``, unchanged, against RabbitMQ and Postgres."""

from __future__ import annotations

from pathlib import Path

import pytest

from saga_app.pytest_plugin import Sagas
from saga_shared.config import Settings
from tests.unit import test_simkit
from tests.unit.test_simkit import CATALOG, warehouse


@pytest.fixture
def sagas(settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Sagas:
    monkeypatch.setenv("SAGA_TEST_STACK", "real")
    for name, value in (("SAGA_AMQP_URL", settings.amqp_url),
                        ("SAGA_DATABASE_URL", settings.database_url),
                        ("SAGA_IDENTITY", "shared")):  # fmt: skip
        monkeypatch.setenv(name, value)
    path = tmp_path / "catalog.toml"
    path.write_text(CATALOG)
    return Sagas(path, [warehouse()])


def test_a_saga_with_a_gate_completes_on_the_real_stack(sagas: Sagas) -> None:
    assert sagas.real
    test_simkit.test_a_saga_with_a_gate_completes_and_its_events_are_published(sagas)


def test_a_pick_that_never_answers_is_undone_on_the_real_stack(sagas: Sagas) -> None:
    test_simkit.test_a_pick_that_never_answers_is_undone_by_its_key(sagas)
