"""The broker permission table and the definitions the set-up imports, and what discarding a
dead letter means, all computed without a broker."""

from __future__ import annotations

import base64
import hashlib
import re

import pytest

from saga_coordinator.access import definitions, grants, hash_password, vhost_of
from saga_coordinator.desk import discard_meaning
from saga_shared.config import Settings
from saga_shared.errors import ConfigError
from tests.unit.factories import REFUND_PARAMS, start_named

SETTINGS = Settings(amqp_url="amqp://x@h:5672/prod", namespace="shop", people="ana")


def grant(role: str) -> object:
    return next(g for g in grants(SETTINGS) if g.role == role)


@pytest.mark.parametrize(
    ("role", "kind", "name", "allowed"),
    [
        ("agent", "write", "shop.commands", True),
        ("agent", "write", "shop.partitions", False),
        ("agent", "write", "shop.actions", False),
        ("agent", "write", "shop.events", False),
        ("agent", "write", "amq.default", False),
        ("agent", "configure", "shop.intake", False),
        ("agent", "configure", "amq_0123456789abcdef0123456789abcdef", True),
        ("agent", "configure", "amq_evil", False),
        ("agent", "read", "shop.partition.0", False),
        ("agent", "read", "shop.events", True),
        ("inventory", "read", "shop.action.inventory", True),
        ("inventory", "read", "shop.action.email", False),
        ("inventory", "write", "shop.partitions", True),
        ("inventory", "write", "shop.actions", False),
        ("inventory", "configure", "shop.action.inventory", False),
        ("coordinator", "configure", "shop.partition.3", True),
        ("coordinator", "write", "amq.default", True),
        ("coordinator", "configure", "other.intake", False),
    ],
)
def test_the_permission_table(role: str, kind: str, name: str, allowed: bool) -> None:
    # RabbitMQ matches a permission's regular expression anywhere unless it is anchored; every
    # pattern here is anchored, so a match is a match of the whole name
    assert (re.search(getattr(grant(role), kind), name) is not None) is allowed


def test_topic_permissions_limit_an_agent_to_its_three_commands() -> None:
    agent = grant("agent")
    [commands] = [t for t in agent.topics if t[0] == "shop.commands"]  # type: ignore[attr-defined]
    asked = (
        "saga.start",
        "saga.abort",
        "saga.status",
        "saga.approve",
        "saga.resolve",
        "dlq.replay",
    )
    keys = {k: re.match(commands[1], k) is not None for k in asked}
    assert keys == {"saga.start": True, "saga.abort": True, "saga.status": True,
                    "saga.approve": False, "saga.resolve": False, "dlq.replay": False}  # fmt: skip


def test_every_role_has_its_own_user_and_people_are_listed() -> None:
    users = [g.user for g in grants(SETTINGS)]
    assert users == ["saga-coordinator", "saga-email", "saga-erp", "saga-inventory",
                     "saga-payments", "saga-ops", "saga-console", "saga-agent", "ana"]  # fmt: skip


def test_definitions_carry_rabbitmq_sha256_hashes_never_the_passwords() -> None:
    passwords = {g.user: f"pw-{g.user}" for g in grants(SETTINGS)}
    document = definitions(SETTINGS, passwords)

    assert document["vhosts"] == [{"name": "prod"}]
    user = document["users"][0]
    raw = base64.b64decode(user["password_hash"])
    assert raw[4:] == hashlib.sha256(raw[:4] + b"pw-saga-coordinator").digest()
    assert "pw-" not in str(document)
    assert {p["vhost"] for p in document["permissions"]} == {"prod"}


def test_the_hash_is_rabbitmqs_own_for_a_known_salt() -> None:
    salt = bytes.fromhex("908dc60a")
    expected = base64.b64encode(salt + hashlib.sha256(salt + b"test12").digest()).decode()
    assert hash_password("test12", salt) == expected


def test_the_vhost_comes_from_the_url() -> None:
    assert vhost_of(Settings(amqp_url="amqp://h/")) == "/"
    assert vhost_of(Settings(amqp_url="amqp://h/a%2Fb")) == "a/b"


def test_settings_refuse_an_unknown_identity_mode_or_bad_user_names() -> None:
    with pytest.raises(ConfigError, match="SAGA_IDENTITY"):
        Settings(identity="trust-me")
    with pytest.raises(ConfigError, match="SAGA_PEOPLE"):
        Settings(people="ana,bob smith")


def row(kind: str, *, blocks: bool = True, body: bytes = b"") -> dict[str, object]:
    return {"message_type": kind, "blocks_order": blocks, "order_id": "o", "body": body}


def test_what_discarding_means_for_each_kind_of_letter() -> None:
    start = start_named("refund", REFUND_PARAMS).model_dump_json().encode()
    assert "never happened" in discard_meaning(row("saga.start", body=start))
    assert "as if the outcome was lost" in discard_meaning(row("action.done"))
    assert "fires again" in discard_meaning(row("saga.deadline"))
    assert "holds no order" in discard_meaning(row("saga.start", blocks=False))
