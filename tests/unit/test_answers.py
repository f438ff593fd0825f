"""Every command gets an answer, however often it is sent (design rule 12): a command sent again
under its message id hears what the first heard; one sent again under a new id, with the same
content from the same sender, is answered as the first was and changes nothing; a conflicting
one is refused with a reply naming the conflict."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from saga_coordinator.memory import MemoryStore
from saga_coordinator.processor import Processor
from saga_shared.config import Settings
from saga_shared.model.messages import (
    AbortSaga,
    ActionRequest,
    ApproveSaga,
    CommandReply,
    PartitionMessage,
    ResolveSaga,
    SettleRequest,
    StartSaga,
)
from saga_shared.transport.topology import Topology
from tests.unit.factories import (
    CHECKOUT_PARAMS,
    REFUND_PARAMS,
    T0,
    Driver,
    done_for,
    only_reply,
    requests_of,
    sender,
    settled_for,
    start_named,
)
from tests.unit.machine_setup import CATALOG, REPLY_TO, refund

# --- repeats under a new message id (the machine) ------------------------------------------------


def test_an_abort_sent_again_by_its_sender_is_answered_as_the_first_and_changes_nothing() -> None:
    d, _ = refund()
    d.done({"reservation_id": "res-1"})
    d.abort("stop", by="agent-7", role="agent")
    while d.status() == "compensating":  # the credit note in flight lands, then both undone
        d.done()
    assert d.status() == "compensated"
    before = d.state

    t = d.abort("stop", by="agent-7", role="agent", reply_to=REPLY_TO)

    assert t.changed is False and d.state == before and requests_of(t) == []
    reply = only_reply(t)
    assert reply.type == "command.accepted"
    assert reply.reason.startswith("already aborted by agent-7")
    assert "is compensated" in reply.reason


def test_an_abort_of_a_saga_that_failed_on_its_own_is_refused() -> None:
    d, _ = refund()
    d.fail("stock gone")
    t = d.abort("stop", by="agent-7", role="agent", reply_to=REPLY_TO)
    assert only_reply(t).type == "command.rejected"


def test_a_second_person_resolving_is_not_a_repeat() -> None:
    d, _ = refund()
    d.done({"reservation_id": "res-1"})
    d.fail("ERP down")
    d.fail("release failed")  # the compensation fails: needs_human
    assert d.status() == "needs_human"
    d.resolve("done by hand", by="ana")
    again = d.resolve("done by hand", by="ana", reply_to=REPLY_TO)
    other = d.resolve("done by hand", by="bo", reply_to=REPLY_TO)

    assert only_reply(again).type == "command.accepted"
    assert "already resolved by ana" in only_reply(again).reason
    assert only_reply(other).type == "command.rejected"


def _at_the_gate() -> Driver:
    d = Driver(CATALOG)
    d.feed(start_named("checkout_approved", CHECKOUT_PARAMS))
    d.run_forward(3)
    assert d.status() == "awaiting_approval"
    return d


def test_an_approval_sent_again_is_answered_and_never_opens_another_gate() -> None:
    d = _at_the_gate()
    approve = ApproveSaga(saga_id=d.saga_id, order_id="order-1", note="ok", step=3,
                          sender=sender("ana"), reply_to=REPLY_TO)  # fmt: skip
    d.feed(approve)
    assert d.status() == "running"
    t = d.feed(approve.model_copy(update={"message_id": "another-id"}))

    assert t.changed is False
    assert "already approved by ana" in only_reply(t).reason
    second = approve.model_copy(update={"message_id": "a-3", "sender": sender("bo")})
    assert only_reply(d.feed(second)).type == "command.rejected"


def test_an_approval_naming_another_gate_than_the_one_waiting_is_refused() -> None:
    d = _at_the_gate()
    t = d.feed(ApproveSaga(saga_id=d.saga_id, order_id="order-1", step=1, sender=sender("ana"),
                           reply_to=REPLY_TO))  # fmt: skip
    assert only_reply(t).type == "command.rejected"
    assert "waits at the gate before step 3, not 1" in only_reply(t).reason
    assert d.status() == "awaiting_approval"


# --- repeats under the same message id (the processor over the in-memory store) ---------------


class Coordinator:
    """The processor over the in-memory store, as the coordinator runs it: one transaction per
    message; what it commits is published in order (replies kept; the last request and settle
    sent remembered)."""

    def __init__(self) -> None:
        self.topology = Topology.from_settings(Settings(identity="shared", partitions=1))
        self.processor = Processor(CATALOG, self.topology)
        self.store = MemoryStore()
        self.now = T0
        self.last_request: ActionRequest | None = None
        self.last_settle: SettleRequest | None = None

    def handle(self, message: PartitionMessage) -> list[CommandReply]:
        self.now += timedelta(seconds=1)
        now = self.now
        asyncio.run(self.store.run(lambda tx: self.processor.handle(tx, message, now)))
        replies = []
        for row in self.store.take_outbox():
            if row.exchange == "":
                replies.append(CommandReply.model_validate_json(row.body))
            elif row.message_type == "action.request":
                self.last_request = ActionRequest.model_validate_json(row.body)
            elif row.message_type == "action.settle":
                self.last_settle = SettleRequest.model_validate_json(row.body)
        return replies


def _stamped(command: StartSaga | AbortSaga | ResolveSaga) -> StartSaga | AbortSaga | ResolveSaga:
    return command.model_copy(update={"client_message_id": f"client-{command.message_id}"})


def test_a_start_sent_again_under_its_id_is_answered_with_the_first_answer() -> None:
    c = Coordinator()
    start = _stamped(start_named("refund", REFUND_PARAMS, reply_to=REPLY_TO))
    [first] = c.handle(start)
    [again] = c.handle(start.model_copy(update={"reply_to": "amq.gen-a-new-client"}))

    assert first.type == again.type == "command.accepted"
    assert (again.command_id, again.reason) == (first.command_id, first.reason)
    assert again.message_id != first.message_id
    [saga] = c.store.sagas()
    assert [e["note"] for e in c.store.history(saga.saga_id)][-1] == (
        "duplicate absorbed, answered again"
    )


def test_a_refused_command_sent_again_under_its_id_is_refused_again() -> None:
    c = Coordinator()
    abort = AbortSaga(saga_id="nobody", order_id="order-1", reason="stop", reply_to=REPLY_TO,
                      sender=sender(role="agent"))  # fmt: skip
    [first] = c.handle(abort)
    [again] = c.handle(abort)
    assert first.type == again.type == "command.rejected"
    assert again.reason == first.reason == "no saga nobody"


def test_the_answer_given_later_is_the_one_a_repeat_hears() -> None:
    """An abort's answer waits for the e-mail in flight to be settled; sent again meanwhile,
    from another client, that client hears the same answer then; after, a repeat hears what
    the first finally heard."""
    c = Coordinator()
    c.handle(start_named("refund", REFUND_PARAMS))
    for result in ({"reservation_id": "r-1"}, {"credit_note_id": "c-1"}):
        assert c.last_request is not None
        c.handle(done_for(c.last_request, result))
    assert c.last_request is not None and c.last_request.action == "email.send_customer_email"
    abort = AbortSaga(saga_id="saga-1", order_id="order-1", reason="stop", reply_to=REPLY_TO,
                      sender=sender("agent-7", "agent"))  # fmt: skip
    assert c.handle(abort) == []  # its answer waits for the settle
    assert c.handle(abort) == []  # the same client: one answer, once settled
    assert c.handle(abort.model_copy(update={"reply_to": "amq.gen-another"})) == []
    assert c.last_settle is not None
    final, other = c.handle(settled_for(c.last_settle, "fenced"))
    assert other.reason == final.reason
    [later] = c.handle(abort)
    assert (later.type, later.reason) == (final.type, final.reason)
    assert "did not happen" in final.reason
