"""The pure decision function ``decide``: irreversible and read-only steps, duplicates and
stale messages, a saga waiting behind another of its order.

Each test plays the part of the adapters and the agent: it answers the request in flight with
``done`` or ``failed``, aborts or resumes, and checks the register and the messages going out.
"""

from __future__ import annotations

import pytest

from saga_coordinator.machine import begin, decide
from saga_shared.model.messages import (
    ActionDone,
    ActionFailed,
    ActionRequest,
)
from tests.unit.factories import (
    CHECKOUT_PARAMS,
    REFUND_PARAMS,
    T0,
    Driver,
    assert_ignored,
    done_for,
    event,
    event_types,
    failed_for,
    only_reply,
    requests_of,
    start_named,
)
from tests.unit.machine_setup import (
    CATALOG,
    FOUR,
    REPLY_TO,
    adhoc,
    refund,
    waiting_refund,
)

# --- irreversible and read-only steps ------------------------------------------------------------


def test_irreversible_step_that_landed_is_impossible_to_undo_never_compensated() -> None:
    d, _ = adhoc(["inventory.hold", "email.notify", "erp.audit"])
    d.run_forward(2)
    d.fail("audit found a problem")
    while d.status() == "compensating":
        d.done()

    assert d.status() == "compensated"
    notify = d.step(1)
    assert notify.status == "done"
    assert notify.compensation_status == "impossible"
    assert d.compensation_requests() == [(0, "inventory.unhold")]
    assert not any(r.action.startswith("email.") for r in d.requests if r.phase == "compensation")


def test_irreversible_done_without_its_result_field_still_counts_as_done() -> None:
    # The missing-identifier rule exists because a compensation needs the id ("done without
    # email_id, which the compensation needs"). An irreversible action has no compensation:
    # the e-mail was sent, so calling it a failure would undo the credit note and release the
    # stock after the customer was told the refund is on its way.
    d, _ = refund()
    d.run_forward(2)
    d.done({})  # email.send_customer_email: sent, but the adapter gave no email_id

    assert d.step(2).status == "done"
    assert d.status() == "completed"
    assert d.compensation_requests() == []


def test_irreversible_step_failing_with_unknown_effect_is_settled_before_compensating() -> None:
    d, _ = adhoc(["inventory.hold", "email.notify"])
    d.done()
    d.fail("smtp timeout", effect_unknown=True)
    assert d.step(1).status == "in_doubt"
    assert d.compensation_requests() == []  # nothing acts around a step in doubt
    d.settled("fenced")
    while d.status() == "compensating":
        d.done()

    assert d.status() == "compensated"
    assert d.step(1).compensation_status == "none"  # it never happened: nothing to undo
    assert d.compensation_requests() == [(0, "inventory.unhold")]


def test_irreversible_step_is_not_requested_after_a_failure() -> None:
    d = Driver(CATALOG)
    d.feed(start_named("checkout", CHECKOUT_PARAMS))
    d.run_forward(2)
    d.fail("address unknown")  # erp.validate_address

    assert "email.send_confirmation" not in [r.action for r in d.requests]
    assert d.step(3).status == "skipped"


def test_read_only_steps_are_never_compensated() -> None:
    d = Driver(CATALOG)
    d.feed(start_named("checkout", CHECKOUT_PARAMS))
    d.run_forward(3)
    d.fail("mail server refused", effect_unknown=False)
    while d.status() == "compensating":
        d.done()

    assert d.status() == "compensated"
    assert d.compensation_requests() == [
        (1, "payments.refund_charge"),
        (0, "inventory.release_stock"),
    ]
    assert d.step(2).action == "erp.validate_address"
    assert (d.step(2).status, d.step(2).compensation_status) == ("done", "none")


def test_read_only_step_failing_with_unknown_effect_is_not_compensated() -> None:
    d, _ = adhoc(["inventory.hold", "erp.check"])
    d.done()
    d.fail("timeout", effect_unknown=True)
    while d.status() == "compensating":
        d.done()

    assert d.step(1).compensation_status == "none"
    assert d.compensation_requests() == [(0, "inventory.unhold")]


# --- duplicates and stale messages ---------------------------------------------------------------


def test_second_done_for_the_same_step_is_ignored() -> None:
    d, _ = refund()
    first = d.last_request
    d.done({"reservation_id": "res-1"})
    before = d.state

    t = d.feed(done_for(first, {"reservation_id": "res-OTHER"}))

    assert_ignored(d, t, before)
    assert d.step(0).result == {"reservation_id": "res-1"}


def test_failed_after_done_for_the_same_step_is_ignored() -> None:
    d, _ = refund()
    first = d.last_request
    d.done()
    before = d.state

    t = d.feed(failed_for(first, "late failure", effect_unknown=True))

    assert_ignored(d, t, before)


def test_done_for_a_step_not_running_is_ignored() -> None:
    d, _ = refund()
    before = d.state
    running = d.last_request
    fake = running.model_copy(
        update={
            "step": 2,
            "action": "email.send_customer_email",
            "idempotency_key": "saga-1:email.send_customer_email",
        }
    )

    t = d.feed(done_for(fake, {"email_id": "em-1"}))

    assert_ignored(d, t, before)
    assert d.step(2).status == "pending"


@pytest.mark.parametrize(
    "update",
    [
        {"idempotency_key": "saga-1:inventory.reserve_stock:resume-1"},
        {"idempotency_key": "saga-0:inventory.reserve_stock"},
        {"action": "erp.create_credit_note"},
        {"step": 9},
        {"phase": "compensation"},
    ],
    ids=["wrong-key", "other-saga-key", "wrong-action", "unknown-step", "wrong-phase"],
)
def test_outcome_that_does_not_match_the_request_in_flight_is_ignored(
    update: dict[str, object],
) -> None:
    d, _ = refund()
    before = d.state
    fake = d.last_request.model_copy(update=update)

    t = d.feed(done_for(fake, {"reservation_id": "res-1"}))

    assert_ignored(d, t, before)
    assert d.step(0).status == "running"


def test_compensation_outcome_for_a_compensation_not_running_is_ignored() -> None:
    d, _ = adhoc([*FOUR, "erp.check"])
    d.run_forward(4)
    d.fail("address invalid")
    assert d.last_request.step == 3
    before = d.state
    # step 0's compensation is pending, not running: an outcome for it is out of date
    fake = ActionRequest(
        saga_id="saga-1",
        order_id="order-1",
        action="inventory.unhold",
        phase="compensation",
        step=0,
        idempotency_key="saga-1:inventory.unhold",
        params={},
        timeout_s=1,
    )

    t = d.feed(done_for(fake, {"ok": True}))

    assert_ignored(d, t, before)
    assert d.step(0).compensation_status == "pending"


def test_duplicate_compensation_outcome_is_ignored() -> None:
    d, _ = refund()
    d.done()
    d.fail("ERP refused")
    comp = d.last_request
    d.done()
    assert d.status() == "compensated"
    before = d.state

    for message in (done_for(comp, {"x": 1}), failed_for(comp, "late", effect_unknown=False)):
        t = d.feed(message)
        assert_ignored(d, t, before)


def test_compensation_outcome_for_a_step_without_compensation_is_ignored() -> None:
    d, _ = adhoc(["erp.check", "inventory.hold", "erp.audit"])
    d.run_forward(2)
    d.fail("audit failed")
    before = d.state
    fake = d.last_request.model_copy(update={"step": 0})

    t = d.feed(done_for(fake, {}))

    assert_ignored(d, t, before)


@pytest.mark.parametrize(
    "message",
    [
        ActionDone(
            saga_id="ghost",
            order_id="o",
            action="inventory.reserve_stock",
            phase="forward",
            step=0,
            idempotency_key="ghost:inventory.reserve_stock",
            result={"reservation_id": "r"},
        ),
        ActionFailed(
            saga_id="ghost",
            order_id="o",
            action="inventory.release_stock",
            phase="compensation",
            step=0,
            idempotency_key="ghost:inventory.release_stock",
            reason="x",
            effect_unknown=True,
        ),
    ],
    ids=["done", "failed"],
)
def test_outcomes_for_an_unknown_saga_are_ignored(message: ActionDone | ActionFailed) -> None:
    t = decide(None, message, CATALOG, T0)

    assert (t.state, t.out, t.changed) == (None, (), False)


def test_a_start_sent_again_changes_nothing_and_is_answered_with_where_the_saga_stands() -> None:
    d, _ = refund(reply_to=REPLY_TO)
    d.done()
    before = d.state

    t = d.feed(start_named("refund", REFUND_PARAMS, reply_to=REPLY_TO))

    assert t.changed is False and d.state == before
    assert requests_of(t) == []
    reply = only_reply(t)
    assert reply.type == "command.accepted"
    assert reply.reason == f"already started: saga {d.saga_id} is running"


def test_a_saga_id_reused_with_other_parameters_is_refused_naming_the_conflict() -> None:
    d, _ = refund(reply_to=REPLY_TO)
    before = d.state
    t = d.feed(start_named("refund", {**REFUND_PARAMS, "amount_cents": 1}, reply_to=REPLY_TO))

    assert t.changed is False and d.state == before
    reply = only_reply(t)
    assert reply.type == "command.rejected"
    assert "other parameters for erp.create_credit_note (amount_cents)" in reply.reason


def test_a_saga_id_reused_for_another_order_is_refused_without_touching_that_saga() -> None:
    d, _ = refund(reply_to=REPLY_TO)
    other = start_named("refund", REFUND_PARAMS, reply_to=REPLY_TO).model_copy(
        update={"order_id": "another-order"}
    )
    t = decide(d.state, other, CATALOG, T0)

    assert t.state is None  # the other order's saga is not this order's business
    reply = only_reply(t)
    assert reply.type == "command.rejected" and "another order" in reply.reason
    assert "order-" not in reply.reason.replace("another order", "")


def test_redelivered_forward_outcome_after_compensation_began_is_ignored() -> None:
    d, _ = refund()
    d.done()
    failing = d.last_request
    d.fail("ERP refused")
    before = d.state

    t = d.feed(failed_for(failing, "ERP refused", effect_unknown=False))

    assert_ignored(d, t, before)


# --- waiting behind another saga of the same order ---------------------------------------------


def test_start_while_the_order_is_held_waits_without_requesting_anything() -> None:
    d, t = waiting_refund(reply_to=REPLY_TO)

    assert d.status() == "waiting"
    assert d.st.waiting_for == "saga-1"
    assert [s.status for s in d.st.steps] == ["pending"] * 3
    assert requests_of(t) == []
    assert only_reply(t).type == "command.accepted"
    assert event_types(t) == ["saga.waiting"]
    waiting = event(t, "saga.waiting")
    assert "saga-1" in waiting.detail
    assert "order-1" in waiting.detail


def test_start_while_no_saga_holds_the_order_runs_at_once() -> None:
    d = Driver(CATALOG)
    t = d.feed(start_named("refund", REFUND_PARAMS))

    assert d.status() == "running"
    assert d.st.waiting_for is None
    assert len(requests_of(t)) == 1


def test_begin_gives_the_order_to_a_waiting_saga() -> None:
    d, _ = waiting_refund()

    t = begin(d.st, d.now())
    d.state = t.state
    d.requests.extend(requests_of(t))

    assert d.status() == "running"
    assert d.st.waiting_for is None
    assert event_types(t) == ["saga.started", "step.started"]
    (req,) = requests_of(t)
    assert (req.step, req.action, req.idempotency_key) == (
        0,
        "inventory.reserve_stock",
        "saga-2:inventory.reserve_stock",
    )
    d.run_forward(3)
    assert d.status() == "completed"


def test_outcomes_for_a_waiting_saga_are_ignored() -> None:
    d, _ = waiting_refund()
    before = d.state
    fake = ActionRequest(
        saga_id="saga-2",
        order_id="order-1",
        action="inventory.reserve_stock",
        phase="forward",
        step=0,
        idempotency_key="saga-2:inventory.reserve_stock",
        params={},
        timeout_s=1,
    )

    t = d.feed(done_for(fake, {"reservation_id": "r"}))

    assert_ignored(d, t, before)


def test_abort_of_a_waiting_saga_ends_it_without_any_action() -> None:
    d, _ = waiting_refund()

    t = d.abort("duplicate request", by="ops-ann", reply_to=REPLY_TO)

    assert d.status() == "compensated"
    assert d.st.finished_at is not None
    assert d.st.waiting_for is None
    assert [s.status for s in d.st.steps] == ["skipped"] * 3
    assert all(s.compensation_status == "none" for s in d.st.steps)
    assert d.st.reason is not None
    assert "duplicate request" in d.st.reason
    decision = d.st.decisions[-1]
    assert (decision.kind, decision.note, decision.by) == ("abort", "duplicate request", "ops-ann")
    assert requests_of(t) == []
    assert only_reply(t).type == "command.accepted"
    done = event(t, "saga.compensated")
    assert done.saga_register is not None
    assert done.saga_register["status"] == "compensated"


def test_resume_or_resolve_of_a_waiting_saga_is_rejected() -> None:
    d, _ = waiting_refund()
    before = d.state

    for t in (d.resume(reply_to=REPLY_TO), d.resolve(reply_to=REPLY_TO)):
        assert t.changed is False
        assert d.state == before
        assert only_reply(t).type == "command.rejected"
        assert "waiting" in only_reply(t).reason
