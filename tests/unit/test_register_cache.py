from __future__ import annotations

from saga_coordinator.cache import RegisterCache
from saga_coordinator.convoy import OrderView
from saga_coordinator.register import SagaState
from tests.unit.factories import REFUND_PARAMS, Driver, real_catalog, start_named


def running(saga_id: str) -> SagaState:
    driver = Driver(real_catalog())
    driver.feed(start_named("refund", REFUND_PARAMS, saga_id=saga_id))
    return driver.st


def test_the_least_recently_used_register_goes_first_when_full() -> None:
    cache = RegisterCache(capacity=2)
    a, b, c = running("saga-a"), running("saga-b"), running("saga-c")
    cache.put("1", a)
    cache.put("2", b)

    assert cache.get("saga-a") == ("1", a)  # a is now the most recent
    cache.put("3", c)

    assert len(cache) == 2
    assert cache.get("saga-b") is None
    assert cache.get("saga-a") == ("1", a) and cache.get("saga-c") == ("3", c)


def test_a_newer_version_replaces_the_held_one() -> None:
    cache = RegisterCache()
    state = running("saga-a")
    cache.put("1", state)
    later = state.evolve(reason="later")

    cache.put("2", later)

    assert cache.get("saga-a") == ("2", later)


def test_a_register_that_ended_is_not_kept() -> None:
    cache = RegisterCache()
    state = running("saga-a")
    cache.put("1", state)

    cache.put("2", state.evolve(status="completed"))

    assert cache.get("saga-a") is None and len(cache) == 0


def test_orders_are_held_with_their_version_the_least_recently_used_going_first() -> None:
    cache = RegisterCache(capacity=2)
    a, b, c = (OrderView(f"order-{x}", None, 1, 0, has_waiting=False) for x in "abc")
    cache.put_order("1", a)
    cache.put_order("2", b)
    assert cache.order("order-a") == ("1", a)

    cache.put_order("3", c)

    assert cache.order("order-b") is None
    assert cache.order("order-a") == ("1", a) and cache.order("order-c") == ("3", c)
    cache.forget_order("order-a")
    assert cache.order("order-a") is None
    assert len(cache) == 0  # counts registers, not orders
