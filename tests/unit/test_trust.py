"""Who may send what: the directory of users and roles, the checks on every message's sender,
and what each role may do to a saga. All pure."""

from __future__ import annotations

import aio_pika
import pytest

from saga_coordinator.authority import may_act, may_decide_gate, may_send
from saga_shared.config import Settings
from saga_shared.errors import InvalidMessage, PlanRejected
from saga_shared.model.messages import ActionDone, ActionRequest, DeadlineReached, Sender
from saga_shared.security import trust
from saga_shared.security.identity import Directory, amqp_url_for, user_of_url, with_credentials
from saga_shared.transport.bus import Bus
from tests.unit.factories import AGENT, REFUND_PARAMS, Driver, real_catalog, start_named

ROLES = Directory.from_settings(Settings(people="ana,dana", agents="bot-*,helper"))
SHARED = Directory.from_settings(Settings(identity="shared"))


def outcome(action: str = "erp.create_credit_note") -> ActionDone:
    return ActionDone(saga_id="s", order_id="o", action=action, phase="forward", step=1,
                      idempotency_key=f"s:{action}", result={"credit_note_id": "cn-1"})  # fmt: skip


@pytest.mark.parametrize(
    ("user", "role"),
    [
        ("saga-coordinator", "coordinator"), ("saga-erp", "erp"), ("saga-ops", "ops"),
        ("saga-console", "console"), ("ana", "person"), ("bot-7", "agent"),
        ("helper", "agent"), ("mallory", None), (None, None), ("saga-admin", None),
    ],
)  # fmt: skip
def test_the_directory_names_each_users_role(user: str | None, role: str | None) -> None:
    assert ROLES.role_of(user) == role


def test_shared_mode_trusts_its_one_account_for_everything_and_nobody_else() -> None:
    assert SHARED.role_of("guest") == "person"
    assert SHARED.is_coordinator("guest") and SHARED.owns("guest", "erp.create_credit_note")
    assert SHARED.role_of("mallory") is None and not SHARED.owns(None, "erp.x")


def test_an_outcome_is_believed_only_from_the_service_that_owns_its_action() -> None:
    trust.partition_message(ROLES, outcome(), "saga-erp")
    for user in ("saga-inventory", "saga-coordinator", "ana", None):
        with pytest.raises(trust.Forged):
            trust.partition_message(ROLES, outcome(), user)


def test_the_first_sender_a_moved_outcome_names_is_believed_only_from_a_coordinator() -> None:
    """A coordinator moving an outcome to a quorum queue names who the broker verified on it;
    the same header from anyone else is ignored, and the outcome judged as theirs."""
    moved = {trust.MOVED_HEADER: "saga-erp"}
    assert trust.first_sender(ROLES, "saga-coordinator", moved) == "saga-erp"
    trust.partition_message(ROLES, outcome(), trust.first_sender(ROLES, "saga-coordinator", moved))
    for user in ("saga-inventory", "ana", None):
        assert trust.first_sender(ROLES, user, moved) == user
        with pytest.raises(trust.Forged):
            trust.partition_message(ROLES, outcome(), trust.first_sender(ROLES, user, moved))
    assert trust.first_sender(ROLES, "saga-erp", None) == "saga-erp"


def test_commands_and_deadlines_in_a_partition_come_only_from_the_coordinator() -> None:
    command = start_named("refund", REFUND_PARAMS)
    deadline = DeadlineReached(saga_id="s", order_id="o", step=0, phase="forward",
                               idempotency_key="s:x", attempt=1)  # fmt: skip
    trust.partition_message(ROLES, command, "saga-coordinator")
    trust.partition_message(ROLES, deadline, "saga-coordinator")
    with pytest.raises(trust.Forged):
        trust.partition_message(ROLES, command, "bot-7")
    unsent = command.model_copy(update={"sender": None})
    with pytest.raises(InvalidMessage, match="only through the intake"):
        trust.partition_message(ROLES, unsent, "saga-coordinator")


def test_a_request_only_from_the_coordinator_and_only_for_its_service() -> None:
    request = ActionRequest(saga_id="s", order_id="o", action="email.send_confirmation",
                            phase="forward", step=0, idempotency_key="s:e", params={},
                            timeout_s=5)  # fmt: skip
    trust.request(ROLES, request, "saga-coordinator", "email")
    with pytest.raises(trust.Forged):
        trust.request(ROLES, request, None, "email")
    with pytest.raises(InvalidMessage, match="not an action of erp"):
        trust.request(ROLES, request, "saga-coordinator", "erp")


def test_a_command_without_user_id_or_from_a_stranger_is_forged() -> None:
    assert trust.command_sender(ROLES, "bot-1") == "agent"
    for user in (None, "mallory", "saga-erp", "saga-coordinator"):
        with pytest.raises(trust.Forged):
            trust.command_sender(ROLES, user)


def test_forwarded_ids_are_stable_per_sender_and_never_shared_between_senders() -> None:
    assert trust.forwarded_id("a", "m-1") == trust.forwarded_id("a", "m-1")
    assert trust.forwarded_id("a", "m-1") != trust.forwarded_id("b", "m-1")


@pytest.mark.parametrize(
    ("role", "command", "allowed"),
    [
        ("agent", "saga.start", True), ("agent", "saga.abort", True),
        ("agent", "saga.approve", False), ("agent", "saga.resolve", False),
        ("agent", "saga.resume", False), ("agent", "dlq.replay", False),
        ("ops", "saga.resume", True), ("ops", "dlq.discard", True), ("ops", "saga.resolve", False),
        ("person", "saga.resolve", True), ("console", "saga.approve", True),
    ],
)  # fmt: skip
def test_what_each_role_may_ever_send(role: str, command: str, allowed: bool) -> None:
    assert (may_send(role, command) is None) is allowed  # type: ignore[arg-type]


def test_an_agent_acts_only_on_the_sagas_it_started() -> None:
    d = Driver(real_catalog())
    d.feed(start_named("refund", REFUND_PARAMS))
    assert may_act(d.st, "saga.abort", AGENT) is None
    stranger = Sender(user="agent-8", role="agent")
    assert "not started by agent-8" in (may_act(d.st, "saga.abort", stranger) or "")
    assert may_act(d.st, "saga.abort", Sender(user="ana", role="person")) is None
    assert may_act(d.st, "saga.abort", None) == "the command has no verified sender"


def test_no_agent_decides_at_a_gate_and_a_persons_gate_needs_a_person() -> None:
    ops, ana = Sender(user="saga-ops", role="ops"), Sender(user="ana", role="person")
    assert "agent" in (may_decide_gate(False, AGENT) or "")
    assert may_decide_gate(False, ops) is None
    assert "person" in (may_decide_gate(True, ops) or "")
    assert may_decide_gate(True, ana) is None


def test_urls_get_each_roles_credentials_quoted(tmp_path: object) -> None:
    url = with_credentials("amqps://old:pw@broker.example:5671/v?cafile=/ca.pem", "a@b", "p:/w")
    assert url == "amqps://a%40b:p%3A%2Fw@broker.example:5671/v?cafile=/ca.pem"
    assert user_of_url(url) == "a@b"
    assert amqp_url_for(Settings(identity="shared"), "anyone") == Settings().amqp_url


def test_a_url_naming_no_user_stamps_the_user_it_logs_in_as() -> None:
    # aiormq logs in as guest when the URL names no user; a message stamped with no user_id was
    # refused as forged, unanswered.
    assert user_of_url("amqp://127.0.0.1/") == "guest"
    bare = Settings(amqp_url="amqp://127.0.0.1/", identity="shared")
    bus = Bus(bare)
    assert bus._stamped(aio_pika.Message(b"{}")).user_id == "guest"
    assert trust.command_sender(Directory.from_settings(bare), bus.user) is not None


def test_only_the_console_names_the_person_it_acts_for() -> None:
    header = {trust.ON_BEHALF_HEADER: "ana"}
    assert trust.acting_sender(ROLES, "saga-ops", "ops", {}) == Sender(user="saga-ops", role="ops")
    acting = trust.acting_sender(ROLES, "saga-console", "console", header)
    assert acting == Sender(user="ana", role="person", via="saga-console")
    assert acting.acting_as == "person via saga-console"
    for user, role in [("saga-ops", "ops"), ("bot-7", "agent"), ("ana", "person")]:
        with pytest.raises(PlanRejected, match="only the console may act on behalf"):
            trust.acting_sender(ROLES, user, role, header)  # type: ignore[arg-type]
    for bad in ["", "a b", "ana\x00", "x" * 65, 7, ["ana"], b"\xff"]:
        with pytest.raises(PlanRejected, match="not a user name"):
            trust.acting_sender(ROLES, "saga-console", "console", {trust.ON_BEHALF_HEADER: bad})
    # shared mode verifies nothing: its one account is the console too
    assert trust.acting_sender(SHARED, "guest", "person", header).via == "guest"


def test_a_console_operator_who_is_not_a_person_acts_as_an_operator() -> None:
    """A console account named in SAGA_PEOPLE decides as that person; any other operator
    decides as an operator, so a gate that needs a person, a resolve or a settle refuses it."""
    via_console = {trust.ON_BEHALF_HEADER: "olga"}  # a console operator, not in SAGA_PEOPLE
    olga = trust.acting_sender(ROLES, "saga-console", "console", via_console)
    assert olga == Sender(user="olga", role="ops", via="saga-console")
    assert "person" in (may_decide_gate(True, olga) or "")
    assert may_decide_gate(False, olga) is None
    assert may_send(olga.role, "saga.resolve") == "only a person may resolve a saga"
    assert may_send(olga.role, "saga.settle") is not None
