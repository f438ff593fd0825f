"""Whether a message's verified sender may send it. Pure: the consumers and the dead-letter
ingester ask the same questions, so a message is judged the same way wherever it is looked at.

``user`` is the AMQP ``user_id`` the broker checked against the publishing connection (or, for a
message an operator replayed, the ``user_id`` it carried when it first arrived).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from typing import Any

from saga_shared.errors import InvalidMessage, PlanRejected
from saga_shared.model.catalog import service_of
from saga_shared.model.ids import name_id
from saga_shared.model.messages import (
    ActionDone,
    ActionFailed,
    ActionRequest,
    ActionSettled,
    PartitionMessage,
    Role,
    Sender,
    SettleRequest,
)
from saga_shared.model.text import header_text
from saga_shared.security.identity import Directory

REPLAY_HEADER = "x-replay-of"
# Set by a coordinator that moved an outcome from a partition's classic outcome queue to its quorum
# queue (saga_coordinator.coordinator): the user the broker verified on the outcome as published.
MOVED_HEADER = "x-saga-moved-from"
# Set by the console on the commands it sends for the person signed in to it.
ON_BEHALF_HEADER = "x-on-behalf-of"
_PERSON = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")
# Fixed for ever: the ids the intake forwards commands under derive from it, and a changed one
# would let a re-sent command through as new.
FORWARD_NAMESPACE = uuid.UUID("0c3b8f0e-5d5e-4a51-9f0e-7a2b64d1c9a7")


def forwarded_id(sender: str, message_id: str) -> str:
    """The id the intake forwards a command under: the same for a re-sent or redelivered
    command, and never one a client chose (no client can collide with another's messages)."""
    return name_id(FORWARD_NAMESPACE, f"{sender}\x00{message_id}")


class Forged(InvalidMessage):
    """The sender may not send this message: it is dead-lettered as ``forged``, never applied."""


def command_sender(directory: Directory, user: str | None) -> Role:
    """The role a command is sent in; ``Forged`` when the sender may send no command at all."""
    if user is None:
        raise Forged("no user_id: publish commands with user_id set to your broker user")
    role = directory.command_role(user)
    if role is None:
        raise Forged(f"user {user!r} may not send commands")
    return role


def acting_sender(
    directory: Directory, user: str, role: Role, headers: Mapping[str, Any] | None
) -> Sender:
    """Who a command acts for. The console signs people and operators in and sends their
    decisions from its own account, naming them in ``x-on-behalf-of``: one named in
    ``SAGA_PEOPLE`` has a person's rights, anyone else an operator's (as the CLI's ops account),
    and the register records who, via the console. Only the console's account (or the one
    account of ``shared`` mode, which verifies nothing) may name someone else."""
    named = (headers or {}).get(ON_BEHALF_HEADER)
    if named is None:
        return Sender(user=user, role=role)
    if directory.verifies and role != "console":
        raise PlanRejected("not_permitted", f"only the console may act on behalf of a person, "
                           f"not {role} account {user!r}")  # fmt: skip
    person = header_text(named, 80)
    if person is None or not _PERSON.match(person):
        raise PlanRejected("not_permitted", f"{ON_BEHALF_HEADER}: not a user name")
    return Sender(user=person, role="person" if is_person(directory, person) else "ops", via=user)


def is_person(directory: Directory, name: str) -> bool:
    """Whether someone the console signed in has a person's rights: one named in
    ``SAGA_PEOPLE``; anyone in ``shared`` mode, which verifies nobody."""
    return not directory.verifies or name in directory.people


def first_sender(
    directory: Directory, user: str | None, headers: Mapping[str, Any] | None
) -> str | None:
    """Who published a partition's message: the broker's verified ``user``, or, for one a
    coordinator moved from an outcome queue, the user it names (believed from a coordinator
    only: anyone else's header is ignored, and the message judged as theirs)."""
    moved = (headers or {}).get(MOVED_HEADER)
    if moved is not None and directory.is_coordinator(user):
        return header_text(moved, 128)
    return user


def partition_message(directory: Directory, message: PartitionMessage, user: str | None) -> None:
    """An outcome only from the service that owns its action; anything else (commands the
    intake forwarded, deadlines the timer fired) only from the coordinator."""
    if user is None:
        raise Forged(f"{message.type} without user_id")
    if isinstance(message, ActionDone | ActionFailed | ActionSettled):
        if not directory.owns(user, message.action):
            raise Forged(f"{message.type} for {message.action} sent by {user!r}, not its service")
        return
    if not directory.is_coordinator(user):
        raise Forged(f"{message.type} sent by {user!r}; only the coordinator sends it here")
    if message.type.startswith("saga.") and getattr(message, "sender", "") is None:
        raise InvalidMessage(f"{message.type} has no sender: commands reach a partition only "
                             "through the intake")  # fmt: skip


def request(
    directory: Directory, message: ActionRequest | SettleRequest, user: str | None, service: str
) -> None:
    if not directory.is_coordinator(user):
        raise Forged(f"{message.type} sent by {user!r}; only the coordinator sends requests")
    if service_of(message.action) != service:
        raise InvalidMessage(f"{message.action} is not an action of {service}")
