"""The machine's answer to a step deadline: send again, then give up as an unknown effect."""

from __future__ import annotations

from saga_shared.model.messages import ActionRequest, DeadlineReached
from tests.unit.factories import (
    REFUND_PARAMS,
    Driver,
    event_types,
    real_catalog,
    requests_of,
    start_named,
)


def deadline(req: ActionRequest, attempt: int | None = None) -> DeadlineReached:
    return DeadlineReached(
        saga_id=req.saga_id,
        order_id=req.order_id,
        step=req.step,
        phase=req.phase,
        idempotency_key=req.idempotency_key,
        attempt=req.attempt if attempt is None else attempt,
    )


def started() -> Driver:
    d = Driver(real_catalog())
    d.feed(start_named("refund", REFUND_PARAMS))
    return d


def test_a_deadline_resends_the_same_request_with_the_next_attempt() -> None:
    d = started()
    first = d.last_request

    t = d.feed(deadline(first))

    [again] = requests_of(t)
    assert (again.idempotency_key, again.attempt) == (first.idempotency_key, 2)
    assert again.params == first.params
    assert "step.resent" in event_types(t)
    assert d.step(0).sends == 2


def test_a_deadline_for_an_earlier_send_is_stale() -> None:
    d = started()
    first = d.last_request
    d.feed(deadline(first))
    before = d.st

    t = d.feed(deadline(first))  # the deadline of send 1 again: already acted on

    assert t.changed is False and t.out == ()
    assert d.st == before


def test_an_answer_to_an_earlier_send_still_counts() -> None:
    d = started()
    first = d.last_request
    d.feed(deadline(first))

    d.done(request=first)

    assert d.step(0).status == "done"
    assert d.last_request.step == 1


def test_after_the_last_send_the_step_fails_with_an_unknown_effect_and_is_compensated() -> None:
    d = started()
    d.done()
    for _ in range(d.step(1).max_sends - 1):
        d.feed(deadline(d.last_request))
    assert d.step(1).sends == d.step(1).max_sends

    t = d.feed(deadline(d.last_request))

    step = d.step(1)
    assert (step.status, step.effect_unknown) == ("failed", True)
    assert "no answer after 3 send(s)" in (step.error or "")
    assert d.status() == "compensating"
    [undo] = requests_of(t)
    # the step itself may have landed: it is undone first, found by its forward key
    assert (undo.action, undo.step) == ("erp.void_credit_note", 1)
    assert undo.params == {"forward_key": f"{d.saga_id}:erp.create_credit_note"}
    assert d.step(2).status == "skipped"


def test_a_compensation_without_an_answer_ends_in_needs_human() -> None:
    d = started()
    d.done()
    d.fail("erp down")
    undo = d.last_request
    for _ in range(d.step(0).compensation_max_sends - 1):
        d.feed(deadline(d.last_request))
    assert d.last_request.idempotency_key == undo.idempotency_key

    t = d.feed(deadline(d.last_request))

    assert d.status() == "needs_human"
    assert "no answer" in (d.st.needs_human_reason or "")
    assert "saga.needs_human" in event_types(t)
    assert d.step(0).compensation_status == "failed"


def test_a_deadline_after_the_step_finished_is_ignored() -> None:
    d = started()
    first = d.last_request
    d.done()
    before = d.st

    t = d.feed(deadline(first))

    assert t.changed is False
    assert d.st == before


# --- a request lost with its queue (saga_coordinator.lost) ------------------------------------


def lost(req: ActionRequest, service: str) -> DeadlineReached:
    return deadline(req).model_copy(update={"lost": service})


def test_a_request_lost_with_its_queue_is_sent_again_at_once_without_using_a_send() -> None:
    d = started()
    first = d.last_request  # inventory.reserve_stock, send 1 of 3

    t = d.feed(lost(first, "inventory"))

    [again] = requests_of(t)
    assert (again.idempotency_key, again.attempt) == (first.idempotency_key, 2)
    assert (d.step(0).sends, d.step(0).max_sends) == (2, 4)  # the budget grew with it
    assert "step.resent" in event_types(t)
    # Two more sends by deadline, then the step gives up: three counted, as without the loss.
    for _ in range(2):
        d.feed(deadline(d.last_request))
    assert d.step(0).status == "running" and d.step(0).sends == 4
    d.feed(deadline(d.last_request))
    assert (d.step(0).status, d.step(0).effect_unknown) == ("failed", True)


def test_a_lost_mark_twice_for_one_send_resends_once() -> None:
    """Two coordinators found the same loss: the second mark names a send already replaced."""
    d = started()
    first = d.last_request
    d.feed(lost(first, "inventory"))
    before = d.st

    t = d.feed(lost(first, "inventory"))

    assert t.changed is False and t.out == ()
    assert d.st == before


def test_a_lost_mark_for_another_service_or_a_finished_step_changes_nothing() -> None:
    d = started()
    first = d.last_request
    before = d.st
    t = d.feed(lost(first, "erp"))  # the step's request is out to inventory, not erp
    assert t.changed is False and d.st == before

    d.done()
    after = d.st
    t = d.feed(lost(first, "inventory"))
    assert t.changed is False and d.st == after


def test_a_lost_compensation_is_sent_again_without_using_a_send() -> None:
    d = started()
    d.done()
    d.fail("erp down")
    undo = d.last_request  # inventory.release_stock
    limit = d.step(0).compensation_max_sends

    t = d.feed(lost(undo, "inventory"))

    [again] = requests_of(t)
    assert (again.idempotency_key, again.attempt) == (undo.idempotency_key, 2)
    assert d.step(0).compensation_max_sends == limit + 1
