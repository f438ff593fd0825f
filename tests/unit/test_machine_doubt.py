"""Steps in doubt (``saga_coordinator.doubt``): an irreversible step whose outcome is unknown is
settled by its service's key record, a late outcome or a person before anything acts on it."""

from __future__ import annotations

from typing import Literal

from saga_coordinator import deadline
from saga_coordinator.incident import incident
from saga_coordinator.register import forward_key
from saga_shared.model.messages import DeadlineReached, Role
from tests.unit.factories import (
    Driver,
    done_for,
    event_types,
    only_reply,
    replies_of,
    requests_of,
    settles_of,
)
from tests.unit.machine_setup import REPLY_TO, adhoc, refund

EMAIL = "email.send_customer_email"


def _at_the_email(reply_to: str | None = None) -> Driver:
    d, _ = refund(reply_to)
    d.done({"reservation_id": "res-1"})
    d.done({"credit_note_id": "cn-1"})
    assert d.last_request.action == EMAIL
    return d


def _gave_up(d: Driver) -> None:
    """The e-mail's last deadline passed with no answer."""
    req = d.last_request
    for sends in range(req.attempt, d.step(2).max_sends):
        d.feed(_deadline(d, "forward", sends))
    t = d.feed(_deadline(d, "forward", d.step(2).max_sends))
    assert settles_of(t), t.note


def _deadline(d: Driver, phase: Literal["forward", "settle"], attempt: int) -> DeadlineReached:
    key = forward_key(d.saga_id, EMAIL)
    return DeadlineReached(saga_id=d.saga_id, order_id=d.st.order_id, step=2,
                           phase=phase, idempotency_key=key, attempt=attempt)  # fmt: skip


def test_an_irreversible_step_in_doubt_is_settled_before_anything_is_compensated() -> None:
    d = _at_the_email()
    t = d.fail("smtp timeout", effect_unknown=True)

    assert d.step(2).status == "in_doubt"
    assert d.status() == "running"  # not compensating: nothing acts around it
    assert requests_of(t) == []
    [settle] = settles_of(t)
    assert (settle.action, settle.step, settle.idempotency_key) == (
        EMAIL, 2, forward_key(d.saga_id, EMAIL),
    )  # fmt: skip
    assert settle.fence_expired is False
    assert "step.in_doubt" in event_types(t)
    armed = deadline.after(d.st, t, d.now())
    assert isinstance(armed, deadline.Arm) and armed.phase == "settle"


def test_the_last_deadline_of_an_irreversible_step_puts_it_in_doubt_not_in_compensation() -> None:
    d = _at_the_email()
    _gave_up(d)
    assert d.step(2).status == "in_doubt"
    assert d.compensation_requests() == []


def test_fenced_means_it_never_happened_and_the_steps_before_are_compensated() -> None:
    d = _at_the_email()
    d.fail("smtp timeout", effect_unknown=True)
    t = d.settled("fenced", reason="never claimed: fenced")

    step = d.step(2)
    assert (step.status, step.settled, step.effect_unknown) == ("failed", "did_not_happen", False)
    assert step.settled_by == "email (its key record)"
    assert d.status() == "compensating"
    assert "step.settled" in event_types(t)
    d.done()
    d.done()
    assert d.status() == "compensated"
    assert d.compensation_requests() == [
        (1, "erp.void_credit_note"),
        (0, "inventory.release_stock"),
    ]
    report = incident(d.st)
    assert EMAIL in [x["action"] for x in report["never_happened"]]
    assert EMAIL not in [x["action"] for x in report["done"]]


def test_done_means_it_happened_and_the_saga_goes_on_as_if_in_time() -> None:
    d = _at_the_email()
    _gave_up(d)
    t = d.settled("done", result={"email_id": "em-1"})

    assert d.status() == "completed"
    assert d.step(2).status == "done"
    assert d.step(2).result == {"email_id": "em-1"}
    assert d.step(2).settled == "happened"
    assert d.compensation_requests() == []
    assert event_types(t)[-1] == "saga.completed"


def test_a_stored_failure_that_landed_nothing_settles_it_as_not_happened() -> None:
    d = _at_the_email()
    d.fail("smtp timeout", effect_unknown=True)
    d.settled("failed", reason="recipient refused", effect_unknown=False)
    assert d.step(2).settled == "did_not_happen"
    assert d.status() == "compensating"


def test_no_answer_to_the_last_settle_stops_at_needs_human_and_keeps_the_order() -> None:
    d = _at_the_email()
    d.fail("smtp timeout", effect_unknown=True)
    limit = d.step(2).settle_limit
    for sends in range(1, limit):
        t = d.feed(_deadline(d, "settle", sends))
        assert len(settles_of(t)) == 1
    t = d.feed(_deadline(d, "settle", limit))

    assert d.status() == "needs_human"
    assert d.step(2).status == "in_doubt"
    assert "may have happened" in (d.st.needs_human_reason or "")
    assert "saga settle" in (d.st.needs_human_reason or "")
    assert isinstance(deadline.after(d.st, t, d.now()), deadline.Disarm)
    report = incident(d.st)
    assert [x["action"] for x in report["may_have_happened"]] == [EMAIL]
    assert EMAIL not in [x["action"] for x in report["done"]]
    assert d.compensation_requests() == []


def test_in_doubt_from_the_last_send_stops_at_needs_human_and_a_late_outcome_settles_it() -> None:
    d = _at_the_email()
    d.fail("smtp timeout", effect_unknown=True)
    d.settled("in_doubt", reason="claimed by email@host-1, unfinished; no status hook")
    assert d.status() == "needs_human"
    assert "claimed by email@host-1" in (d.st.needs_human_reason or "")

    t = d.done({"email_id": "em-9"})  # the adapter finally answered

    assert d.status() == "completed"
    assert d.step(2).settled_by == "its late outcome"
    assert "saga.completed" in event_types(t)


def test_a_late_fence_after_needs_human_compensates() -> None:
    d = _at_the_email()
    d.fail("smtp timeout", effect_unknown=True)
    first = d.last_settle
    d.settled("in_doubt", reason="unknown")
    d.settled("fenced", request=first)  # an earlier send's answer, come late
    assert d.status() == "compensating"
    assert d.step(2).settled == "did_not_happen"


def test_running_waits_and_the_deadline_asks_again() -> None:
    d = _at_the_email()
    d.fail("smtp timeout", effect_unknown=True)
    t = d.settled("running", reason="claimed by a live call for 3 s more")
    assert d.step(2).settling and d.status() == "running"
    assert settles_of(t) == []
    t = d.feed(_deadline(d, "settle", 1))
    [again] = settles_of(t)
    assert again.attempt == 2


def test_a_person_says_it_happened() -> None:
    d = _at_the_email()
    _gave_up(d)
    d.settled("in_doubt", reason="unknown")
    t = d.settle(2, happened=True, reply_to=REPLY_TO, version=d.st.version)

    assert d.status() == "completed"
    assert d.step(2).settled_by == "ana"
    assert only_reply(t).type == "command.accepted"
    assert [x.kind for x in d.st.decisions] == ["settle_happened"]


def test_a_person_says_it_did_not_happen_which_waits_for_the_service_to_fence_it() -> None:
    d = _at_the_email()
    d.fail("smtp timeout", effect_unknown=True)
    d.settled("in_doubt", reason="unknown")
    t = d.settle(2, happened=False, reply_to=REPLY_TO)

    assert replies_of(t) == []  # answered once the service has fenced it
    [fence] = settles_of(t)
    assert fence.fence_expired is True
    assert d.step(2).status == "in_doubt"
    assert d.compensation_requests() == []
    t = d.settled("fenced")
    reply = only_reply(t)
    assert reply.type == "command.accepted"
    assert "did not happen" in reply.reason
    assert d.status() == "compensating"


def test_the_service_s_answer_wins_over_a_person_who_said_it_did_not_happen() -> None:
    d = _at_the_email()
    d.fail("smtp timeout", effect_unknown=True)
    d.settled("in_doubt", reason="unknown")
    d.settle(2, happened=False, reply_to=REPLY_TO)
    t = d.settled("done", result={"email_id": "em-2"})

    reply = only_reply(t)
    assert reply.type == "command.rejected"
    assert "happened" in reply.reason
    assert d.status() == "completed"


def test_a_live_claim_refuses_a_person_s_did_not_happen() -> None:
    d = _at_the_email()
    d.fail("smtp timeout", effect_unknown=True)
    d.settled("in_doubt", reason="unknown")
    d.settle(2, happened=False, reply_to=REPLY_TO)
    t = d.settled("in_doubt", reason="claimed by email@host-2 until 12:00:05: not fenced")

    assert only_reply(t).type == "command.rejected"
    assert d.status() == "needs_human"
    assert d.step(2).status == "in_doubt"


def test_a_person_s_did_not_happen_fences_only_the_calls_known_when_it_was_said() -> None:
    """Said when the service had reported one claim; by the time the fence is handled a
    second call has claimed the key (its request was queued ahead of the fence): the fence
    carries the count, the service refuses, and the person is asked again, told why."""
    d = _at_the_email()
    d.fail("smtp timeout", effect_unknown=True)
    d.settled("in_doubt", reason="claimed by email@a, its lease over", claims=1)
    assert d.step(2).key_claims == 1
    t = d.settle(2, happened=False, reply_to=REPLY_TO)
    [fence] = settles_of(t)
    assert (fence.fence_expired, fence.fence_claims) == (True, 1)

    t = d.settled("running", reason="claimed by email@b", claims=2)  # the queued request
    assert d.step(2).key_claims == 2 and d.step(2).fence_claims == 1  # the word's bound holds
    t = d.settled("in_doubt", claims=2, reason="not fenced: 2 call(s) have claimed the key, 1 "
                  "when it was said not to have happened")  # fmt: skip
    reply = only_reply(t)
    assert reply.type == "command.rejected" and "not fenced: 2 call(s)" in reply.reason
    assert (d.status(), d.step(2).status) == ("needs_human", "in_doubt")
    [again] = settles_of(d.settle(2, happened=False, reply_to=REPLY_TO))
    assert again.fence_claims == 2  # asked again, the person's word covers both


def test_a_decision_on_an_old_version_of_the_register_is_refused() -> None:
    d = _at_the_email()
    d.fail("smtp timeout", effect_unknown=True)
    d.settled("in_doubt", reason="unknown")
    t = d.settle(2, happened=True, version=d.st.version + 1, reply_to=REPLY_TO)
    assert only_reply(t).type == "command.rejected"
    assert "version" in only_reply(t).reason
    assert d.status() == "needs_human"


def test_only_a_person_settles_and_only_a_step_in_doubt() -> None:
    d = _at_the_email()
    d.fail("smtp timeout", effect_unknown=True)
    d.settled("in_doubt", reason="unknown")
    roles: tuple[Role, ...] = ("ops", "agent")
    for role in roles:
        t = d.settle(2, happened=True, role=role, by="someone", reply_to=REPLY_TO)
        assert only_reply(t).type == "command.rejected"
    t = d.settle(1, happened=True, reply_to=REPLY_TO)
    assert "not in doubt" in only_reply(t).reason
    assert d.status() == "needs_human"


def test_resume_asks_the_service_again() -> None:
    d = _at_the_email()
    d.fail("smtp timeout", effect_unknown=True)
    before = d.last_settle.attempt
    d.settled("in_doubt", reason="unknown")
    t = d.resume("the mail server is back")
    [settle] = settles_of(t)
    assert settle.attempt == before + 1
    assert d.status() == "running"
    d.settled("done", result={"email_id": "em-3"})
    assert d.status() == "completed"


def test_an_abort_while_the_e_mail_is_out_settles_it_first_and_the_answer_says_how() -> None:
    d = _at_the_email()
    t = d.abort("stop", reply_to=REPLY_TO)

    assert replies_of(t) == []
    [settle] = settles_of(t)
    assert settle.action == EMAIL
    assert d.compensation_requests() == []
    t = d.settled("fenced")
    reply = only_reply(t)
    assert reply.type == "command.accepted" and "did not happen" in reply.reason
    assert d.last_request.action == "erp.void_credit_note"


def test_an_abort_that_finds_the_e_mail_sent_is_void_and_says_so() -> None:
    d = _at_the_email()
    d.abort("stop", reply_to=REPLY_TO)
    t = d.settled("done", result={"email_id": "em-4"})
    reply = only_reply(t)
    assert "happened" in reply.reason
    assert d.status() == "completed"
    assert [x.kind for x in d.st.decisions] == ["abort", "abort_overtaken"]


def test_an_abort_while_the_e_mail_runs_then_its_outcome_settles_it() -> None:
    d = _at_the_email()
    d.abort("stop", reply_to=REPLY_TO)
    d.settled("running", reason="a live call holds the key")
    t = d.fail("smtp refused the recipient", effect_unknown=False)
    assert only_reply(t).type == "command.accepted"
    assert d.step(2).settled == "did_not_happen"
    assert d.last_request.action == "erp.void_credit_note"


def test_an_abort_during_a_settle_waits_for_it() -> None:
    d = _at_the_email()
    d.fail("smtp timeout", effect_unknown=True)
    t = d.abort("stop", reply_to=REPLY_TO)
    assert replies_of(t) == [] and settles_of(t) == [] and requests_of(t) == []
    t = d.settled("fenced")
    assert only_reply(t).type == "command.accepted"
    assert d.last_request.action == "erp.void_credit_note"


def test_a_compensable_step_in_doubt_records_which_way_its_compensation_found_it() -> None:
    d, _ = adhoc(["inventory.hold", "erp.book"])
    d.done({"hold_id": "h-1"})
    d.fail("ERP timed out", effect_unknown=True)
    assert d.last_request.action == "erp.unbook"  # its compensation settles it
    d.feed(done_for(d.last_request, {"undone": True}).model_copy(update={"forward": "fenced"}))
    assert d.step(1).settled == "did_not_happen"
    report = incident(d.st)
    assert "erp.book" in [x["action"] for x in report["never_happened"]]


def test_a_stale_settle_answer_after_it_was_settled_changes_nothing() -> None:
    d = _at_the_email()
    d.fail("smtp timeout", effect_unknown=True)
    first = d.last_settle
    d.settled("done", result={"email_id": "em-5"})
    before = d.state
    t = d.settled("fenced", request=first)
    assert t.changed is False and d.state == before
