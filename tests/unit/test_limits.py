"""Bounds that keep a flood or a hostile value from costing anything: per-agent token buckets,
rate-limited logs, parameter bounds from the catalog, results an adapter cannot carry."""

from __future__ import annotations

import logging

import pytest

from saga_services.errors import Permanent
from saga_services.outcome import Done, build_outcome, unfit_result
from saga_shared.errors import PlanRejected
from saga_shared.model.catalog import INT_MAX, Catalog
from saga_shared.model.gateway import validate_params
from saga_shared.model.messages import ActionDone, ActionFailed, ActionRequest
from saga_shared.observability.logs import RateLimit
from saga_shared.security.ratelimit import TokenBuckets
from tests.unit.factories import real_catalog


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_bucket_allows_its_burst_then_its_rate_per_key() -> None:
    clock = Clock()
    buckets = TokenBuckets(rate=2.0, burst=3, clock=clock)

    assert [buckets.allow("a") for _ in range(4)] == [True, True, True, False]
    assert buckets.allow("b")  # another agent has its own bucket
    clock.now = 0.5  # one token back
    assert [buckets.allow("a"), buckets.allow("a")] == [True, False]
    clock.now = 100.0  # never more than the burst
    assert [buckets.allow("a") for _ in range(4)] == [True, True, True, False]


def test_buckets_stay_bounded_whatever_the_number_of_keys() -> None:
    clock = Clock()
    buckets = TokenBuckets(rate=1.0, burst=1, clock=clock)
    for i in range(TokenBuckets.MAX_KEYS + 5):
        buckets.allow(f"k{i}")
        clock.now += 2.0  # every earlier bucket is full again
    assert len(buckets._buckets) < 10  # the full ones were dropped when the map grew too big


def record(msg: str, level: int = logging.WARNING) -> logging.LogRecord:
    return logging.LogRecord("saga", level, __file__, 1, msg, (), None)


def test_the_same_complaint_is_logged_a_few_times_a_minute_then_counted() -> None:
    clock = Clock()
    limit = RateLimit(per_window=3, window_s=60, clock=clock)

    passed = [limit.filter(record("refused command %s")) for _ in range(10)]
    assert passed == [True] * 3 + [False] * 7
    assert limit.filter(record("another complaint"))
    assert limit.filter(record("routine", logging.INFO))  # below warnings: never limited
    clock.now = 61
    first = record("refused command %s")
    assert limit.filter(first) and "[7 similar suppressed]" in str(first.msg)


def test_only_the_first_traceback_of_a_window_is_kept() -> None:
    limit = RateLimit(per_window=5, clock=Clock())
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        import sys

        info = sys.exc_info()
    first, second = record("failed"), record("failed")
    first.exc_info = second.exc_info = info
    limit.filter(first)
    limit.filter(second)
    assert first.exc_info is not None and second.exc_info is None


CATALOG: Catalog = real_catalog()
STEPS = ("inventory.reserve_stock", "erp.create_credit_note", "email.send_customer_email")
GOOD = {"sku": "S", "quantity": 2, "amount_cents": 100, "customer_email": "a@b.c"}


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"quantity": 10**30}, "less than or equal to 2147483647"),
        ({"quantity": INT_MAX + 1}, "less than or equal to 2147483647"),
        ({"amount_cents": -(2**31) - 1}, "greater than or equal"),
        ({"sku": "x" * 1001}, "at most 1000"),
        ({"sku": ""}, "at least 1"),
        ({"sku": "   "}, "must not be blank"),
        ({"quantity": True}, "not a boolean"),
        ({"quantity": [1]}, "valid integer"),
    ],
)
def test_parameters_outside_what_the_systems_can_take_are_refused_at_the_gateway(
    change: dict[str, object], words: str
) -> None:
    with pytest.raises(PlanRejected) as refused:
        validate_params(CATALOG, STEPS, {**GOOD, **change})
    assert refused.value.rule == "params_invalid" and words in str(refused.value)


def test_the_catalog_can_declare_its_own_bounds() -> None:
    catalog = Catalog.model_validate(
        {
            "actions": {
                "inventory.check": {
                    "class": "read_only",
                    "params": {"n": {"type": "int", "min": 1, "max": 5}, "s": {"type": "str",
                               "max_length": 3}, "x": "float"},
                }
            }
        }
    )  # fmt: skip
    assert validate_params(catalog, ["inventory.check"], {"n": 5, "s": "abc", "x": 1.5})
    with pytest.raises(PlanRejected, match="less than or equal to 5"):
        validate_params(catalog, ["inventory.check"], {"n": 6, "s": "a", "x": 0})
    with pytest.raises(PlanRejected, match="x"):
        validate_params(catalog, ["inventory.check"], {"n": 1, "s": "a", "x": 1e300})


def request() -> ActionRequest:
    return ActionRequest(saga_id="s", order_id="o", action="inventory.reserve_stock",
                         phase="forward", step=0, idempotency_key="s:inventory.reserve_stock",
                         params={}, timeout_s=5)  # fmt: skip


def test_a_result_that_cannot_travel_is_reported_as_a_failure_that_may_have_landed() -> None:
    assert unfit_result({"reservation_id": "r-1"}) is None
    sent = build_outcome(request(), Done({"reservation_id": "r\x1b[2J"}), tries=1)

    assert isinstance(sent, ActionFailed) and sent.effect_unknown
    assert "cannot be carried" in sent.reason
    assert isinstance(build_outcome(request(), Done({"reservation_id": "r"}), 1), ActionDone)


def test_a_systems_error_text_is_cleaned_before_it_travels() -> None:
    sent = build_outcome(request(), Permanent("no\x00stock\ud800"), tries=1)

    assert isinstance(sent, ActionFailed) and sent.reason == "no\\x00stock\ufffd"
