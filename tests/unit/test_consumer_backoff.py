"""How long a lost consumer waits before subscribing again: doubling while subscribing keeps
failing, short again once a subscription has run."""

from __future__ import annotations

from typing import Any

from saga_shared.transport.backoff import Backoff


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def waits(backoff: Backoff, clock: Clock, n: int, ran_s: float = 0.0) -> list[float]:
    """``n`` subscriptions in a row, each lost after ``ran_s``: the wait after each."""
    out = []
    state: Any = None  # the wait reads no retry state
    for _ in range(n):
        backoff.subscribing()
        clock.now += ran_s
        out.append(backoff(state))
    return out


def test_the_wait_doubles_while_subscribing_keeps_failing_up_to_five_seconds() -> None:
    clock = Clock()
    backoff = Backoff(ran_s=5.0, clock=clock)
    assert waits(backoff, clock, 8) == [0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0, 5.0]
    assert waits(backoff, clock, 10_000)[-1] == 5.0  # hours of a broker away: no overflow


def test_a_subscription_that_ran_is_followed_by_the_short_wait_again() -> None:
    clock = Clock()
    backoff = Backoff(ran_s=5.0, clock=clock)
    assert waits(backoff, clock, 7)[-1] == 5.0  # a broker restart: seven failed subscriptions
    assert waits(backoff, clock, 1, ran_s=3600.0) == [0.2]  # an hour later, a fresh loss
    assert waits(backoff, clock, 2) == [0.4, 0.8]
    assert waits(backoff, clock, 1, ran_s=4.9) == [1.6]  # lost again before it had run
