"""Which partitions a look starts, stops and sends again (``saga_coordinator.ownership.change``)."""

from __future__ import annotations

from saga_coordinator.ownership import Change, change


def test_partitions_taken_are_consumed_and_their_running_requests_sent_again() -> None:
    assert change(consuming=[], asked=[0, 1, 2], took=[0, 2]) == Change(
        start=frozenset({0, 2}), resend=frozenset({0, 2})
    )


def test_a_partition_consumed_asked_for_again_and_not_taken_is_another_s_now() -> None:
    # The session was lost (a freeze, a database restart): everything consumed is asked again.
    assert change(consuming=[0, 1], asked=[0, 1, 3], took=[1]) == Change(
        stop=frozenset({0}), resend=frozenset({1})
    )


def test_a_look_that_takes_nothing_changes_nothing() -> None:
    assert change(consuming=[0, 1], asked=[2, 3], took=[]) == Change()
    # What a live session holds is not asked again, so it is never stopped.
    assert change(consuming=[0, 1], asked=[], took=[]) == Change()


def test_a_partition_taken_back_after_a_lost_session_is_sent_again_not_restarted() -> None:
    assert change(consuming=[0], asked=[0], took=[0]) == Change(resend=frozenset({0}))
