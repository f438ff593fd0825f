"""The pure decision function ``decide``: compensation, needs_human, resume and resolve.

Each test plays the part of the adapters and the agent: it answers the request in flight with
``done`` or ``failed``, aborts or resumes, and checks the register and the messages going out.
"""

from __future__ import annotations

import pytest

from saga_coordinator.machine import decide
from saga_shared.model.messages import (
    ResolveSaga,
)
from tests.unit.factories import (
    T0,
    Driver,
    assert_ignored,
    compensable,
    done_for,
    event,
    event_types,
    events_of,
    failed_for,
    make_catalog,
    only_reply,
    read_only,
    requests_of,
    start_plan,
)
from tests.unit.machine_setup import (
    ADHOC,
    CATALOG,
    FOUR,
    REPLY_TO,
    adhoc,
    reach_needs_human,
    refund,
)

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
