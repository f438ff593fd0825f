"""The pure decision function ``decide``: every transition, driven message by message.

Each test plays the part of the adapters and the agent: it answers the request in flight with
``done`` or ``failed``, aborts or resumes, and checks the register and the messages going out.
"""

from __future__ import annotations

import pytest
from pydantic import JsonValue

from saga_coordinator.machine import begin, decide
from saga_coordinator.transition import Transition
from shared.gateway import admit, check_catalog
from shared.messages import (
    AbortSaga,
    ActionDone,
    ActionFailed,
    ActionRequest,
    ResolveSaga,
    ResumeSaga,
)
from tests.unit.factories import (
    CHECKOUT_PARAMS,
    REFUND_PARAMS,
    T0,
    Driver,
    assert_ignored,
    compensable,
    done_for,
    event,
    event_types,
    events_of,
    failed_for,
    irreversible,
    make_catalog,
    only_reply,
    read_only,
    real_catalog,
    replies_of,
    requests_of,
    start_named,
    start_plan,
    with_residue,
)

CATALOG = real_catalog()
REPLY_TO = "amq.gen-agent-replies"

# Four compensable actions, two read-only, two irreversible: enough for every ordering question.
ADHOC = make_catalog(
    actions={
        "inventory.hold": compensable(
            "inventory.unhold", result=("hold_id",), params={"sku": "str"}
        ),
        "erp.book": compensable("erp.unbook", result=("booking_id", "ledger")),
        "payments.charge": with_residue("payments.refund"),
        "inventory.tag": compensable("inventory.untag", result=("tag_id",)),
        "erp.check": read_only(),
        "erp.audit": read_only(),
        "email.notify": irreversible(),
        "email.receipt": irreversible(),
    },
    compensations={
        "inventory.unhold": {"timeout_s": 3},
        "erp.unbook": {},
        "payments.refund": {},
        "inventory.untag": {},
    },
)
FOUR = ["inventory.hold", "erp.book", "payments.charge", "inventory.tag"]


def refund(reply_to: str | None = None) -> tuple[Driver, Transition]:
    d = Driver(CATALOG)
    return d, d.feed(start_named("refund", REFUND_PARAMS, reply_to=reply_to))


def adhoc(
    steps: list[str], priority: tuple[str, ...] = (), reply_to: str | None = None
) -> tuple[Driver, Transition]:
    d = Driver(ADHOC)
    params: dict[str, JsonValue] = {"sku": "SKU-9"} if "inventory.hold" in steps else {}
    t = d.feed(start_plan(steps, params, priority=priority, reply_to=reply_to))
    assert d.state is not None, t.note
    return d, t


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


# --- compensation order --------------------------------------------------------------------------


def test_compensation_runs_in_reverse_order_of_landing() -> None:
    d, _ = adhoc([*FOUR, "erp.check"])
    d.run_forward(4)
    d.fail("address invalid")
    while d.status() == "compensating":
        d.done()

    assert d.status() == "compensated"
    assert d.compensation_requests() == [
        (3, "inventory.untag"),
        (2, "payments.refund"),
        (1, "erp.unbook"),
        (0, "inventory.unhold"),
    ]
    assert [s.landed_seq for s in d.st.steps] == [1, 2, 3, 4, None]


def test_compensation_priority_goes_first_then_reverse_landing() -> None:
    d, _ = adhoc([*FOUR, "erp.check"], priority=("erp.book",))
    d.run_forward(4)
    d.fail("address invalid")
    while d.status() == "compensating":
        d.done()

    assert [i for i, _ in d.compensation_requests()] == [1, 3, 2, 0]


def test_several_priorities_go_in_the_declared_order() -> None:
    d, _ = adhoc([*FOUR, "erp.check"], priority=("inventory.hold", "payments.charge"))
    d.run_forward(4)
    d.fail("address invalid")
    while d.status() == "compensating":
        d.done()

    assert [i for i, _ in d.compensation_requests()] == [0, 2, 3, 1]


def test_priority_for_a_step_that_never_landed_changes_nothing() -> None:
    d, _ = adhoc(FOUR, priority=("inventory.tag",))
    d.run_forward(2)
    d.fail("declined", effect_unknown=False)  # payments.charge: certainly not charged
    while d.status() == "compensating":
        d.done()

    assert [i for i, _ in d.compensation_requests()] == [1, 0]
    assert d.step(3).status == "skipped"


def test_compensation_request_carries_the_compensation_timeout_from_the_catalog() -> None:
    # catalog.toml: [compensations."inventory.release_stock"] timeout_s = 5; the adapter waits
    # req.timeout_s for the call, so the request must carry the declared value
    d, _ = refund()
    d.done()
    t = d.fail("ERP refused")

    (req,) = requests_of(t)
    assert req.action == "inventory.release_stock"
    assert req.timeout_s == CATALOG.compensations["inventory.release_stock"].timeout_s == 5


def test_adhoc_compensation_timeout_is_taken_from_its_declaration() -> None:
    d, _ = adhoc(["inventory.hold", "erp.check"])
    d.done()
    t = d.fail("address invalid")

    (req,) = requests_of(t)
    assert req.action == "inventory.unhold"
    assert req.timeout_s == ADHOC.compensations["inventory.unhold"].timeout_s == 3


# --- compensation failure, needs_human, resume ---------------------------------------------------


def reach_needs_human() -> tuple[Driver, Transition]:
    """Four steps landed, the fifth fails; undoing step 3 (the first in order) fails."""
    d, _ = adhoc([*FOUR, "erp.check"])
    d.run_forward(4)
    d.fail("address invalid")
    assert d.last_request.step == 3
    t = d.fail("tag service is down", effect_unknown=True, tries=2)
    return d, t


def test_compensation_failure_stops_at_needs_human_with_the_reason() -> None:
    d, t = reach_needs_human()

    assert d.status() == "needs_human"
    assert d.st.needs_human_reason is not None
    assert "inventory.untag" in d.st.needs_human_reason
    assert "tag service is down" in d.st.needs_human_reason
    s3 = d.step(3)
    assert s3.status == "compensation_failed"
    assert s3.compensation_status == "failed"
    assert s3.compensation_error == "tag service is down"
    assert s3.compensation_attempts == 2
    # the other compensations wait for a person: not requested, still pending
    assert requests_of(t) == []
    assert d.compensation_requests() == [(3, "inventory.untag")]
    assert [d.step(i).compensation_status for i in (0, 1, 2)] == ["pending"] * 3
    assert d.st.finished_at is None
    assert event_types(t) == ["step.compensation_failed", "saga.needs_human"]
    alert = event(t, "saga.needs_human")
    assert alert.status == "needs_human"
    assert alert.detail == d.st.needs_human_reason
    assert alert.saga_register is not None
    assert alert.saga_register == d.st.register()
    assert alert.saga_register["needs_human_reason"] == d.st.needs_human_reason


def test_needs_human_ignores_further_outcomes_until_resumed() -> None:
    d, _ = reach_needs_human()
    before = d.state
    old = d.last_request

    t = d.feed(failed_for(old, "again", effect_unknown=True))
    assert_ignored(d, t, before)
    t = d.feed(done_for(old, {"ok": True}))
    assert_ignored(d, t, before)


def test_resume_retries_the_failed_compensation_with_a_new_key_then_the_rest() -> None:
    d, _ = reach_needs_human()
    t = d.resume("tag service restarted", reply_to=REPLY_TO)

    assert only_reply(t).type == "command.accepted"
    assert only_reply(t).command_type == "saga.resume"
    assert d.status() == "compensating"
    assert d.st.needs_human_reason is None
    assert d.st.decisions[-1].kind == "resume"
    assert d.st.decisions[-1].note == "tag service restarted"
    assert "saga.resumed" in event_types(t)
    (req,) = requests_of(t)
    assert (req.step, req.action, req.phase) == (3, "inventory.untag", "compensation")
    assert req.idempotency_key == "saga-1:inventory.untag:resume-1"
    assert req.params == {"tag_id": "tag_id-3", "forward_key": "saga-1:inventory.tag"}
    assert d.step(3).compensation_round == 1

    d.done(tries=3)
    assert d.step(3).compensation_status == "compensated"
    assert d.step(3).status == "compensated"
    assert d.step(3).compensation_attempts == 5  # 2 before the resume, 3 after
    while d.status() == "compensating":
        d.done()

    assert d.status() == "compensated"
    assert [i for i, _ in d.compensation_requests()] == [3, 3, 2, 1, 0]
    assert all(d.step(i).compensation_status == "compensated" for i in range(4))
    # the two other compensations kept their first key: they never failed
    keys = [r.idempotency_key for r in d.requests if r.phase == "compensation"]
    assert keys[2:] == ["saga-1:payments.refund", "saga-1:erp.unbook", "saga-1:inventory.unhold"]


def test_resume_skips_compensations_already_done() -> None:
    d, _ = adhoc([*FOUR, "erp.check"])
    d.run_forward(4)
    d.fail("address invalid")
    d.done()  # step 3 undone
    d.done()  # step 2 undone
    assert d.last_request.step == 1
    d.fail("ERP locked the ledger")
    assert d.status() == "needs_human"

    t = d.resume()
    (req,) = requests_of(t)
    assert (req.step, req.idempotency_key) == (1, "saga-1:erp.unbook:resume-1")
    d.done()
    d.done()

    assert d.status() == "compensated"
    assert [i for i, _ in d.compensation_requests()] == [3, 2, 1, 1, 0]
    assert [d.step(i).compensation_round for i in range(4)] == [0, 1, 0, 0]


def test_a_second_resume_gets_a_second_fresh_key() -> None:
    d, _ = reach_needs_human()
    d.resume()
    d.fail("still down")
    assert d.status() == "needs_human"
    t = d.resume()

    (req,) = requests_of(t)
    assert req.idempotency_key == "saga-1:inventory.untag:resume-2"
    assert [dec.kind for dec in d.st.decisions] == ["resume", "resume"]


def test_the_outcome_of_an_old_compensation_round_is_ignored_after_resume() -> None:
    d, _ = reach_needs_human()
    first_round = d.last_request
    d.resume()
    before = d.state

    t = d.feed(done_for(first_round, {"ok": True}))

    assert_ignored(d, t, before)
    assert d.step(3).compensation_status == "running"


def test_resume_of_a_last_compensation_finishes_the_saga() -> None:
    d, _ = refund()
    d.done()
    d.fail("ERP refused")
    d.fail("inventory down")
    assert d.status() == "needs_human"
    d.resume()
    t = d.done()

    assert d.status() == "compensated"
    assert event_types(t) == ["step.compensated", "saga.compensated"]


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


def test_irreversible_step_failing_with_unknown_effect_is_impossible_to_undo() -> None:
    d, _ = adhoc(["inventory.hold", "email.notify"])
    d.done()
    d.fail("smtp timeout", effect_unknown=True)
    while d.status() == "compensating":
        d.done()

    assert d.step(1).compensation_status == "impossible"
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


def test_duplicate_start_for_an_existing_saga_is_ignored() -> None:
    d, _ = refund(reply_to=REPLY_TO)
    d.done()
    before = d.state

    t = d.feed(start_named("refund", REFUND_PARAMS, reply_to=REPLY_TO))

    assert_ignored(d, t, before)


def test_redelivered_forward_outcome_after_compensation_began_is_ignored() -> None:
    d, _ = refund()
    d.done()
    failing = d.last_request
    d.fail("ERP refused")
    before = d.state

    t = d.feed(failed_for(failing, "ERP refused", effect_unknown=False))

    assert_ignored(d, t, before)


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


# --- waiting behind another saga of the same order ---------------------------------------------


def waiting_refund(reply_to: str | None = None) -> tuple[Driver, Transition]:
    d = Driver(CATALOG)
    command = start_named("refund", REFUND_PARAMS, saga_id="saga-2", reply_to=reply_to)
    t = decide(None, command, CATALOG, d.now(), order_held_by="saga-1")
    d.state = t.state
    d.transitions.append(t)
    return d, t


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


# --- resolve: a person takes over a needs_human saga --------------------------------------------


def test_resolve_ends_a_needs_human_saga_as_resolved_with_the_decision() -> None:
    d, _ = reach_needs_human()

    t = d.resolve("voided the tag by hand", by="ops-bob", reply_to=REPLY_TO)

    assert d.status() == "resolved"
    assert d.st.finished_at is not None
    decision = d.st.decisions[-1]
    assert (decision.kind, decision.note, decision.by) == (
        "resolve",
        "voided the tag by hand",
        "ops-bob",
    )
    assert requests_of(t) == []
    assert only_reply(t).type == "command.accepted"
    assert only_reply(t).command_type == "saga.resolve"
    resolved = event(t, "saga.resolved")
    assert resolved.saga_register is not None
    assert resolved.saga_register["status"] == "resolved"
    # nothing more is undone by the machine once a person has taken over
    assert d.compensation_requests() == [(3, "inventory.untag")]


def test_a_resolved_saga_ignores_late_outcomes_and_refuses_commands() -> None:
    d, _ = reach_needs_human()
    old = d.last_request
    d.resolve()
    before = d.state

    t = d.feed(done_for(old, {"ok": True}))
    assert_ignored(d, t, before)
    for t in (d.resume(reply_to=REPLY_TO), d.abort(reply_to=REPLY_TO)):
        assert t.changed is False
        assert only_reply(t).type == "command.rejected"
    assert d.state == before


@pytest.mark.parametrize("status", ["running", "compensating", "completed", "compensated"])
def test_resolve_of_a_saga_not_in_needs_human_is_rejected(status: str) -> None:
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

    t = d.resolve(reply_to=REPLY_TO)

    assert t.changed is False
    assert d.state == before
    assert events_of(t) == []
    reply = only_reply(t)
    assert reply.type == "command.rejected"
    assert status in reply.reason


def test_resolve_of_an_unknown_saga_is_rejected() -> None:
    command = ResolveSaga(saga_id="ghost", order_id="o", note="n", reply_to=REPLY_TO)

    t = decide(None, command, CATALOG, T0)

    assert (t.state, t.changed) == (None, False)
    assert only_reply(t).type == "command.rejected"


def test_who_decided_is_recorded_for_abort_and_resume() -> None:
    d, _ = refund()
    d.done()
    d.abort("wrong order", by="agent-7")
    d.done()
    d.fail("warehouse offline")
    d.resume("warehouse back", by="ops-ann")

    assert [(x.kind, x.by) for x in d.st.decisions] == [("abort", "agent-7"), ("resume", "ops-ann")]


# --- a known gap: two actions sharing one compensation -------------------------------------------


def test_two_steps_sharing_a_compensation_get_distinct_compensation_keys() -> None:
    # Adapters store the first result per idempotency key and return it for every later call
    # with that key. If two steps' compensations share a key, the second undo is answered from
    # the first one's stored result and never runs. The plan must either be refused by the
    # gateway or each compensation must get its own key.
    catalog = make_catalog(
        actions={
            "inventory.reserve_stock": compensable("inventory.release_stock"),
            "inventory.reserve_extra": compensable("inventory.release_stock"),
            "erp.check": read_only(),
        },
        compensations=["inventory.release_stock"],
    )
    d = Driver(catalog)
    t = d.feed(start_plan(["inventory.reserve_stock", "inventory.reserve_extra", "erp.check"]))
    if d.state is None:  # refused by the gateway: acceptable, if it says why
        assert "[" in t.note
        return
    d.run_forward(2)
    d.fail("address invalid")
    d.done()
    d.done()

    keys = [r.idempotency_key for r in d.requests if r.phase == "compensation"]
    assert len(keys) == 2
    assert len(set(keys)) == 2, f"both compensations use the key {keys[0]}"


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
