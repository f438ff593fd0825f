"""Pure rules of the adapter: outcome ids, effect_unknown, the outcome message."""

from __future__ import annotations

import uuid
from typing import Literal

import pytest

from saga_services.errors import Permanent, Transient
from saga_services.outcome import (
    MAX_REASON,
    OUTCOME_NAMESPACE,
    Done,
    build_outcome,
    effect_unknown,
    outcome_message_id,
)
from saga_shared.model.messages import ActionDone, ActionFailed, ActionRequest


def make_request(attempt: int = 1) -> ActionRequest:
    return ActionRequest(
        saga_id="saga-1",
        order_id="order-1",
        action="inventory.reserve_stock",
        phase="forward",
        step=2,
        idempotency_key="saga-1:inventory.reserve_stock",
        params={"sku": "A", "quantity": 1},
        attempt=attempt,
        timeout_s=5,
    )


def test_outcome_id_is_deterministic_uuid5() -> None:
    first = outcome_message_id("k", "done", 1)

    assert first == outcome_message_id("k", "done", 1)
    assert first == str(uuid.uuid5(OUTCOME_NAMESPACE, "k|done|1"))
    assert uuid.UUID(first).version == 5


@pytest.mark.parametrize(
    ("key", "outcome", "attempt"), [("k2", "done", 1), ("k", "failed", 1), ("k", "done", 2)]
)
def test_outcome_id_changes_with_key_outcome_and_attempt(
    key: str, outcome: Literal["done", "failed"], attempt: int
) -> None:
    assert outcome_message_id(key, outcome, attempt) != outcome_message_id("k", "done", 1)


def test_effect_unknown_is_what_the_error_says_may_have_landed() -> None:
    assert effect_unknown(Transient("timed out")) is True
    assert effect_unknown(Transient("connection refused", may_have_landed=False)) is False
    assert effect_unknown(Permanent("card declined")) is False
    assert effect_unknown(Permanent("answered without an id", may_have_landed=True)) is True
    assert effect_unknown(Done({"x": 1})) is False


def test_done_outcome_echoes_the_request() -> None:
    req = make_request(attempt=3)
    out = build_outcome(req, Done({"reservation_id": "res-1"}), tries=2)

    assert isinstance(out, ActionDone)
    assert out.result == {"reservation_id": "res-1"}
    assert (out.saga_id, out.order_id, out.action, out.phase, out.step) == (
        "saga-1", "order-1", "inventory.reserve_stock", "forward", 2
    )  # fmt: skip
    assert (out.idempotency_key, out.attempt, out.tries) == (req.idempotency_key, 3, 2)
    assert out.message_id == outcome_message_id(req.idempotency_key, "done", 3)


def test_stored_failure_is_certain() -> None:
    req = make_request()
    out = build_outcome(req, Permanent("quantity must be positive"), tries=1)

    assert isinstance(out, ActionFailed)
    assert out.effect_unknown is False
    assert out.reason == "quantity must be positive"
    assert out.message_id == outcome_message_id(req.idempotency_key, "failed", 1)


def test_exhausted_retries_may_have_landed() -> None:
    out = build_outcome(make_request(), Transient("no answer within 5s"), tries=4)

    assert isinstance(out, ActionFailed)
    assert out.effect_unknown is True
    assert out.tries == 4
    assert out.reason == "gave up after 4 tries: no answer within 5s"


def test_long_reason_is_cut_to_fit_the_message() -> None:
    out = build_outcome(make_request(), Permanent("x" * 10_000), tries=1)

    assert isinstance(out, ActionFailed)
    assert len(out.reason) == MAX_REASON


def test_redelivered_request_gives_an_identical_outcome_id() -> None:
    # The timestamp differs between the two, the id must not: the coordinator dedupes by id.
    verdict = Done({"reservation_id": "res-1"})
    first = build_outcome(make_request(), verdict, tries=1)
    again = build_outcome(make_request(), verdict, tries=1)

    assert first.message_id == again.message_id
