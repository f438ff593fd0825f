"""The pure decision function ``decide``: commands refused, and abort.

Each test plays the part of the adapters and the agent: it answers the request in flight with
``done`` or ``failed``, aborts or resumes, and checks the register and the messages going out.
"""

from __future__ import annotations

import pytest

from saga_coordinator.machine import decide
from saga_shared.model.messages import (
    AbortSaga,
    ResumeSaga,
)
from tests.unit.factories import (
    REFUND_PARAMS,
    T0,
    Driver,
    assert_ignored,
    event_types,
    events_of,
    only_reply,
    requests_of,
    start_named,
    start_plan,
)
from tests.unit.machine_setup import (
    CATALOG,
    REPLY_TO,
    refund,
)

# --- commands refused ----------------------------------------------------------------------------


@pytest.mark.parametrize("status", ["running", "compensating", "completed", "compensated"])
def test_resume_of_a_saga_not_in_needs_human_is_rejected(status: str) -> None:
    d, _ = refund()
    if status == "compensating":
        d.done()
        d.fail("boom")
    elif status == "completed":
        d.run_forward(3)
    elif status == "compensated":
        d.fail("boom")
    assert d.status() == status
    before = d.state

    t = d.resume(reply_to=REPLY_TO)

    assert t.changed is False
    assert d.state == before
    assert requests_of(t) == []
    assert events_of(t) == []
    reply = only_reply(t)
    assert reply.type == "command.rejected"
    assert reply.command_type == "saga.resume"
    assert status in reply.reason
    assert "needs_human" in reply.reason


@pytest.mark.parametrize("status", ["compensating", "completed", "compensated", "needs_human"])
def test_abort_of_a_saga_not_running_is_rejected(status: str) -> None:
    d, _ = refund()
    if status == "compensating":
        d.done()
        d.fail("boom")
    elif status == "completed":
        d.run_forward(3)
    elif status == "compensated":
        d.fail("boom")
    elif status == "needs_human":
        d.done()
        d.fail("boom")
        d.fail("inventory down")
    assert d.status() == status
    before = d.state

    t = d.abort("stop", reply_to=REPLY_TO)

    assert t.changed is False
    assert d.state == before
    assert requests_of(t) == []
    assert events_of(t) == []
    reply = only_reply(t)
    assert reply.type == "command.rejected"
    assert reply.command_type == "saga.abort"
    assert status in reply.reason


def test_refused_commands_without_reply_to_send_nothing() -> None:
    d, _ = refund()
    before = d.state

    t = d.resume(reply_to=None)

    assert_ignored(d, t, before)


@pytest.mark.parametrize(
    "command",
    [
        AbortSaga(saga_id="ghost", order_id="order-1", reason="stop", reply_to=REPLY_TO),
        ResumeSaga(saga_id="ghost", order_id="order-1", reply_to=REPLY_TO),
    ],
    ids=["abort", "resume"],
)
def test_abort_or_resume_of_an_unknown_saga_is_rejected(command: AbortSaga | ResumeSaga) -> None:
    t = decide(None, command, CATALOG, T0)

    assert t.state is None
    assert t.changed is False
    assert requests_of(t) == []
    assert events_of(t) == []
    reply = only_reply(t)
    assert reply.type == "command.rejected"
    assert reply.command_id == command.message_id
    assert reply.saga_id == "ghost"
    assert "ghost" in reply.reason


def test_abort_of_an_unknown_saga_without_reply_to_sends_nothing() -> None:
    t = decide(None, AbortSaga(saga_id="ghost", order_id="o", reason="x"), CATALOG, T0)

    assert (t.state, t.out, t.changed) == (None, (), False)


@pytest.mark.parametrize(
    ("start_kwargs", "rule", "names"),
    [
        ({"saga": "nope", "params": REFUND_PARAMS}, "unknown_saga", "nope"),
        (
            {"saga": "refund", "params": {**REFUND_PARAMS, "quantity": "two"}},
            "params_invalid",
            "params.quantity",
        ),
        (
            {"saga": "refund", "params": {"sku": "A", "quantity": 1, "amount_cents": 5}},
            "params_invalid",
            "params.customer_email",
        ),
        (
            {"saga": "refund", "params": {**REFUND_PARAMS, "coupon": "X"}},
            "params_invalid",
            "params.coupon",
        ),
    ],
    ids=["unknown-saga", "ill-typed", "missing", "unexpected"],
)
def test_start_refused_by_the_gateway_stores_nothing_and_replies_with_the_rule(
    start_kwargs: dict[str, object], rule: str, names: str
) -> None:
    saga = start_kwargs["saga"]
    params = start_kwargs["params"]
    assert isinstance(saga, str)
    assert isinstance(params, dict)
    command = start_named(saga, params, reply_to=REPLY_TO)

    t = decide(None, command, CATALOG, T0)

    assert t.state is None
    assert requests_of(t) == []
    assert events_of(t) == []
    reply = only_reply(t)
    assert reply.type == "command.rejected"
    assert reply.command_type == "saga.start"
    assert reply.command_id == command.message_id
    assert f"[{rule}]" in reply.reason
    assert names in reply.reason


def test_adhoc_plan_breaking_a_rule_is_refused_naming_step_and_rule() -> None:
    command = start_plan(
        ["email.send_confirmation", "inventory.reserve_stock"],
        {"customer_email": "a@b.c", "sku": "A", "quantity": 1},
        reply_to=REPLY_TO,
    )

    t = decide(None, command, CATALOG, T0)

    assert t.state is None
    reason = only_reply(t).reason
    assert "[irreversible_not_last]" in reason
    assert "step 0" in reason


def test_refused_start_without_reply_to_sends_nothing() -> None:
    t = decide(None, start_named("nope", {}), CATALOG, T0)

    assert t.state is None
    assert t.out == ()


def test_adhoc_plan_is_admitted_under_the_name_adhoc() -> None:
    d = Driver(CATALOG)
    d.feed(
        start_plan(
            ["erp.validate_address", "email.send_confirmation"],
            {"address": "1 Main St", "customer_email": "a@b.c"},
        )
    )

    assert d.st.saga == "adhoc"
    assert d.last_request.params == {"address": "1 Main St"}


# --- abort ---------------------------------------------------------------------------------------


def test_abort_waits_for_the_step_in_flight_then_compensates_it_and_earlier_steps() -> None:
    d, _ = refund()
    d.done({"reservation_id": "res-1"})
    in_flight = d.last_request
    assert in_flight.step == 1

    t = d.abort("customer called back", reply_to=REPLY_TO)

    assert only_reply(t).type == "command.accepted"
    assert only_reply(t).command_type == "saga.abort"
    assert requests_of(t) == []  # nothing is undone while step 1 may still be landing
    assert event_types(t) == ["saga.compensating"]
    assert d.status() == "compensating"
    assert d.st.reason == "aborted: customer called back"
    assert d.st.decisions[-1].kind == "abort"
    assert d.st.decisions[-1].note == "customer called back"
    assert [s.status for s in d.st.steps] == ["done", "running", "skipped"]
    assert d.step(0).compensation_status == "pending"

    t = d.done({"credit_note_id": "cn-1"}, request=in_flight)

    assert d.step(1).status == "done"
    assert d.step(1).compensation_status == "running"
    (req,) = requests_of(t)
    assert (req.step, req.action) == (1, "erp.void_credit_note")
    assert req.params == {"credit_note_id": "cn-1", "forward_key": "saga-1:erp.create_credit_note"}
    d.done()
    d.done()

    assert d.status() == "compensated"
    assert d.compensation_requests() == [
        (1, "erp.void_credit_note"),
        (0, "inventory.release_stock"),
    ]
    assert "email.send_customer_email" not in [r.action for r in d.requests]
    assert d.st.reason == "aborted: customer called back"


def test_an_irreversible_step_that_lands_after_the_abort_voids_it() -> None:
    d, _ = refund()
    d.done({"reservation_id": "res-1"})
    d.done({"credit_note_id": "cn-1"})
    assert d.last_request.action == "email.send_customer_email"  # irreversible, in flight
    d.abort("too late")
    assert d.status() == "compensating"

    t = d.done()  # the e-mail was sent: undoing the refund now would contradict it

    assert d.status() == "completed"
    assert event_types(t)[-1] == "saga.completed"
    assert d.compensation_requests() == []
    assert [s.compensation_status for s in d.st.steps] == ["none", "none", "none"]
    assert [x.kind for x in d.st.decisions] == ["abort", "abort_overtaken"]
    assert "landed before the abort could stop it" in d.st.decisions[-1].note
    assert d.st.reason is None


def test_an_irreversible_step_that_fails_after_the_abort_leaves_the_abort_standing() -> None:
    d, _ = refund()
    d.done({"reservation_id": "res-1"})
    d.done({"credit_note_id": "cn-1"})
    d.abort("stop")
    d.fail("mail server refused", effect_unknown=False)
    d.done()
    d.done()

    assert d.status() == "compensated"
    assert d.compensation_requests() == [
        (1, "erp.void_credit_note"),
        (0, "inventory.release_stock"),
    ]


def test_abort_then_the_step_in_flight_fails_without_effect() -> None:
    d, _ = refund()
    d.done()
    d.abort()
    t = d.fail("ERP refused", effect_unknown=False)

    assert d.step(1).compensation_status == "none"
    assert "saga.compensating" not in event_types(t)  # it is already compensating
    assert d.st.reason == "aborted: the customer cancelled"
    d.done()
    assert d.status() == "compensated"
    assert d.compensation_requests() == [(0, "inventory.release_stock")]


def test_abort_then_the_step_in_flight_fails_with_unknown_effect() -> None:
    d, _ = refund()
    d.done()
    d.abort()
    t = d.fail("ERP timed out", effect_unknown=True)

    (req,) = requests_of(t)
    assert (req.step, req.params) == (1, {"forward_key": "saga-1:erp.create_credit_note"})
    d.done()
    d.done()
    assert d.status() == "compensated"


def test_abort_during_the_first_step() -> None:
    d, _ = refund()
    d.abort()
    assert d.compensation_requests() == []
    d.done()
    assert d.compensation_requests() == [(0, "inventory.release_stock")]
    d.done()

    assert d.status() == "compensated"
    assert [s.status for s in d.st.steps] == ["compensated", "skipped", "skipped"]


def test_second_abort_is_rejected() -> None:
    d, _ = refund()
    d.abort()
    t = d.abort("again", reply_to=REPLY_TO)

    assert t.changed is False
    assert only_reply(t).type == "command.rejected"
    assert len(d.st.decisions) == 1
