"""The pure decision function ``decide``: the forward path and its failures.

Each test plays the part of the adapters and the agent: it answers the request in flight with
``done`` or ``failed``, aborts or resumes, and checks the register and the messages going out.
"""

from __future__ import annotations

import pytest
from pydantic import JsonValue

from saga_coordinator.machine import decide
from saga_shared.model.gateway import admit, check_catalog
from saga_shared.model.messages import (
    AbortSaga,
)
from tests.unit.factories import (
    REFUND_PARAMS,
    T0,
    done_for,
    event,
    event_types,
    make_catalog,
    only_reply,
    replies_of,
    requests_of,
    start_named,
)
from tests.unit.machine_setup import (
    ADHOC,
    CATALOG,
    REPLY_TO,
    adhoc,
    refund,
)

# --- happy path ----------------------------------------------------------------------------------


def test_refund_start_requests_only_the_first_step_and_accepts_the_command() -> None:
    d, t = refund(reply_to=REPLY_TO)

    assert d.status() == "running"
    assert d.st.saga == "refund"
    assert [s.action for s in d.st.steps] == [
        "inventory.reserve_stock",
        "erp.create_credit_note",
        "email.send_customer_email",
    ]
    assert [s.status for s in d.st.steps] == ["running", "pending", "pending"]
    reply = only_reply(t)
    assert reply.type == "command.accepted"
    assert reply.command_type == "saga.start"
    assert replies_of(t)[0].to == REPLY_TO
    assert event_types(t) == ["saga.started", "step.started"]
    (req,) = requests_of(t)
    assert req.action == "inventory.reserve_stock"
    assert req.phase == "forward"
    assert req.step == 0
    assert req.idempotency_key == "saga-1:inventory.reserve_stock"
    assert req.params == {"sku": "SKU-1", "quantity": 2}
    assert req.timeout_s == 5
    assert (req.saga_id, req.order_id) == ("saga-1", "order-1")


def test_a_start_decided_with_the_plan_the_gateway_admitted_is_the_same_start() -> None:
    command = start_named("refund", REFUND_PARAMS)
    plan = admit(CATALOG, command)
    nothing_known = make_catalog(actions={})  # only the plan given can start it

    given, checked = (
        decide(None, command, nothing_known, T0, admitted=plan),
        decide(None, command, CATALOG, T0),
    )
    assert given.state == checked.state and given.state is not None
    assert given.state.status == "running"
    assert [(r.action, r.idempotency_key, r.params) for r in requests_of(given)] == [
        (r.action, r.idempotency_key, r.params) for r in requests_of(checked)
    ]
    assert event_types(given) == event_types(checked)


def test_start_without_reply_to_sends_no_reply() -> None:
    _, t = refund()

    assert replies_of(t) == []
    assert len(requests_of(t)) == 1


def test_refund_happy_path_runs_each_step_once_in_order_and_completes() -> None:
    d, _ = refund()
    d.done({"reservation_id": "res-1"})
    t1 = d.transitions[-1]
    assert event_types(t1) == ["step.done", "step.started"]
    assert d.last_request.step == 1
    assert d.last_request.params == {"amount_cents": 1500}
    assert d.last_request.idempotency_key == "saga-1:erp.create_credit_note"
    d.done({"credit_note_id": "cn-1"})
    assert d.last_request.step == 2
    assert d.last_request.action == "email.send_customer_email"
    assert d.last_request.params == {"customer_email": "ada@example.com"}
    t = d.done({"email_id": "em-1"})

    assert d.forward_requests() == [
        (0, "inventory.reserve_stock"),
        (1, "erp.create_credit_note"),
        (2, "email.send_customer_email"),
    ]
    assert d.compensation_requests() == []
    assert d.status() == "completed"
    assert d.st.finished_at is not None
    assert [s.status for s in d.st.steps] == ["done", "done", "done"]
    assert [s.result for s in d.st.steps] == [
        {"reservation_id": "res-1"},
        {"credit_note_id": "cn-1"},
        {"email_id": "em-1"},
    ]
    assert [s.attempts for s in d.st.steps] == [1, 1, 1]
    assert all(s.compensation_status == "none" for s in d.st.steps)
    assert [s.landed_seq for s in d.st.steps] == [1, 2, 3]
    assert event_types(t) == ["step.done", "saga.completed"]
    assert requests_of(t) == []
    completed = event(t, "saga.completed")
    assert completed.status == "completed"
    assert completed.saga_register is not None
    assert completed.saga_register == d.st.register()
    assert completed.saga_register["status"] == "completed"
    assert completed.saga_register["steps"][0]["result"] == {"reservation_id": "res-1"}


def test_only_one_request_is_in_flight_at_a_time() -> None:
    d, _ = refund()
    for _ in range(3):
        running = [s.index for s in d.st.steps if s.status == "running"]
        assert running == [d.last_request.step]
        d.done()
    assert len(d.requests) == 3
    assert all(len(requests_of(t)) <= 1 for t in d.transitions)


def test_step_events_name_the_step_and_action() -> None:
    d, t = refund()
    started = event(t, "step.started")
    assert (started.step, started.action, started.status) == (
        0,
        "inventory.reserve_stock",
        "running",
    )
    t = d.done()
    done = event(t, "step.done")
    assert (done.step, done.action) == (0, "inventory.reserve_stock")
    assert done.saga_register is None


def test_timestamps_record_when_each_step_started_and_finished() -> None:
    d, _ = refund()
    started = d.step(0).started_at
    d.done()

    finished = d.step(0).finished_at
    assert started is not None
    assert finished is not None
    assert finished > started
    assert d.st.created_at < d.st.updated_at


# --- forward failure -----------------------------------------------------------------------------


def test_permanent_failure_at_step_1_skips_the_rest_and_compensates_step_0_only() -> None:
    d, _ = refund()
    d.done({"reservation_id": "res-1"})
    t = d.fail("ERP refused the amount", effect_unknown=False)

    assert d.status() == "compensating"
    s0, s1, s2 = d.st.steps
    assert (s1.status, s1.error, s1.effect_unknown) == ("failed", "ERP refused the amount", False)
    assert s1.compensation_status == "none"
    assert s1.landed_seq is None
    assert s2.status == "skipped"
    assert s0.compensation_status == "running"
    assert d.st.reason is not None
    assert "step 1" in d.st.reason
    assert "ERP refused the amount" in d.st.reason
    assert event_types(t) == ["step.failed", "saga.compensating", "step.compensating"]
    assert event(t, "step.failed").detail == "ERP refused the amount"
    (req,) = requests_of(t)
    assert req.phase == "compensation"
    assert req.action == "inventory.release_stock"
    assert req.step == 0
    assert req.idempotency_key == "saga-1:inventory.release_stock"
    assert req.params == {
        "reservation_id": "res-1",
        "forward_key": "saga-1:inventory.reserve_stock",
    }

    t = d.done({"released": True})

    assert d.status() == "compensated"
    assert d.st.finished_at is not None
    s0 = d.step(0)
    assert (s0.status, s0.compensation_status) == ("compensated", "compensated")
    assert s0.compensation_result == {"released": True}
    assert s0.compensated_at is not None
    assert event_types(t) == ["step.compensated", "saga.compensated"]
    compensated = event(t, "saga.compensated")
    assert compensated.saga_register is not None
    assert compensated.saga_register["status"] == "compensated"
    assert d.compensation_requests() == [(0, "inventory.release_stock")]
    assert "email.send_customer_email" not in [r.action for r in d.requests]
    assert d.step(2).status == "skipped"


def test_certain_failure_of_the_first_step_compensates_nothing() -> None:
    d, _ = refund()
    t = d.fail("out of stock", effect_unknown=False)

    assert d.status() == "compensated"
    assert [s.status for s in d.st.steps] == ["failed", "skipped", "skipped"]
    assert all(s.compensation_status == "none" for s in d.st.steps)
    assert requests_of(t) == []
    assert event_types(t) == ["step.failed", "saga.compensating", "saga.compensated"]
    assert len(d.requests) == 1


def test_failure_with_unknown_effect_is_compensated_through_the_forward_key() -> None:
    d, _ = refund()
    d.done({"reservation_id": "res-1"})
    t = d.fail("ERP timed out", effect_unknown=True)

    s1 = d.step(1)
    assert (s1.status, s1.effect_unknown, s1.compensation_status) == ("failed", True, "running")
    assert s1.landed_seq == 2
    (req,) = requests_of(t)
    assert (req.step, req.action, req.phase) == (1, "erp.void_credit_note", "compensation")
    assert req.params == {"forward_key": "saga-1:erp.create_credit_note"}
    assert "credit_note_id" not in req.params
    d.done()
    assert d.last_request.step == 0
    d.done()

    assert d.status() == "compensated"
    assert d.compensation_requests() == [
        (1, "erp.void_credit_note"),
        (0, "inventory.release_stock"),
    ]
    assert d.step(1).status == "compensated"


def test_failure_known_not_to_have_landed_is_not_compensated() -> None:
    d, _ = refund()
    d.done()
    d.fail("ERP refused", effect_unknown=False)
    d.done()

    assert d.compensation_requests() == [(0, "inventory.release_stock")]
    assert d.step(1).compensation_status == "none"
    assert d.step(1).status == "failed"


@pytest.mark.parametrize(
    "result",
    [{}, {"reservation_id": ""}, {"reservation_id": None}, {"something_else": "x"}],
    ids=["empty", "blank", "null", "other-field"],
)
def test_done_without_a_declared_result_field_counts_as_failed_with_unknown_effect(
    result: dict[str, JsonValue],
) -> None:
    d, _ = refund()
    t = d.done(result)

    s0 = d.step(0)
    assert s0.status == "failed"
    assert s0.effect_unknown is True
    assert s0.error is not None
    assert "reservation_id" in s0.error
    assert s0.result == result
    assert d.status() == "compensating"
    assert [s.status for s in d.st.steps[1:]] == ["skipped", "skipped"]
    assert "step.failed" in event_types(t)
    assert "step.done" not in event_types(t)
    (req,) = requests_of(t)
    assert (req.step, req.action) == (0, "inventory.release_stock")
    assert req.params == {"forward_key": "saga-1:inventory.reserve_stock"}
    d.done()
    assert d.status() == "compensated"


def test_partial_result_passes_the_identifiers_it_has_to_the_compensation() -> None:
    d, _ = adhoc(["erp.book", "erp.check"])
    t = d.done({"booking_id": "bk-7"})  # "ledger" is missing

    assert d.step(0).status == "failed"
    (req,) = requests_of(t)
    assert req.params == {"booking_id": "bk-7", "forward_key": "saga-1:erp.book"}


def test_result_values_that_are_falsy_but_present_count_as_given() -> None:
    d, _ = adhoc(["erp.book", "erp.check"])
    d.done({"booking_id": 0, "ledger": False})

    assert d.step(0).status == "done"


def test_read_only_and_irreversible_steps_need_no_result_fields_unless_declared() -> None:
    d, _ = adhoc(["erp.check", "erp.audit"])
    d.done({})
    d.done({"anything": 1})

    assert d.status() == "completed"


# --- attempts ------------------------------------------------------------------------------------


def test_tries_accumulate_into_attempts() -> None:
    d, _ = refund()
    d.done(tries=3)
    d.fail("ERP refused", tries=4)

    assert d.step(0).attempts == 3
    assert d.step(1).attempts == 4
    d.done(tries=2)
    assert d.step(0).compensation_attempts == 2
    assert d.step(0).attempts == 3


def test_decide_never_mutates_the_state_it_was_given() -> None:
    d, _ = refund()
    snapshot = d.st.model_dump()
    state = d.st
    decide(state, done_for(d.last_request, {"reservation_id": "r"}), CATALOG, T0)
    decide(state, AbortSaga(saga_id="saga-1", order_id="order-1", reason="x"), CATALOG, T0)

    assert state.model_dump() == snapshot


def test_the_adhoc_catalogs_of_this_module_pass_the_gateway() -> None:
    # guards the fixtures above: a catalog that breaks a rule would make these tests meaningless
    check_catalog(ADHOC)
