"""How long the next batch waits for company (``saga_shared.transport.linger``)."""

from __future__ import annotations

import pytest

from saga_shared.config import Settings
from saga_shared.errors import ConfigError
from saga_shared.transport.linger import Linger

LINGER = Linger(most_s=0.005, per_message_s=0.0005)


@pytest.mark.parametrize("last", [0, 1])
def test_after_a_batch_of_one_or_none_nothing_waits(last: int) -> None:
    assert LINGER.wait(last, waiting=0, most=32) == 0.0


def test_the_wait_grows_with_the_last_batch_up_to_the_most() -> None:
    assert LINGER.wait(2, waiting=0, most=32) == pytest.approx(0.001)
    assert LINGER.wait(8, waiting=3, most=32) == pytest.approx(0.004)
    assert LINGER.wait(31, waiting=0, most=32) == pytest.approx(0.005)


def test_a_batch_already_full_does_not_wait() -> None:
    assert LINGER.wait(31, waiting=32, most=32) == 0.0


def test_off_by_default_and_from_settings_in_milliseconds() -> None:
    assert Linger().wait(31, waiting=0, most=32) == 0.0
    settings = Settings.from_env(
        {"SAGA_BATCH_LINGER_MS": "2", "SAGA_BATCH_LINGER_PER_MESSAGE_MS": "0.25"}
    )
    assert Linger.from_settings(settings) == Linger(0.002, 0.00025)
    assert (
        Linger.from_settings(Settings.from_env({"SAGA_BATCH_LINGER_MS": "0"})).wait(
            31, waiting=0, most=32
        )
        == 0.0
    )


@pytest.mark.parametrize("value", ["-1", "1001", "nan", "soon"])
def test_a_linger_out_of_range_is_refused_naming_the_variable(value: str) -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_env({"SAGA_BATCH_LINGER_MS": value})
    assert "SAGA_BATCH_LINGER_MS" in str(info.value)
