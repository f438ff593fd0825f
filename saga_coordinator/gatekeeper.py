"""The checks every command from a client passes, wherever it arrives: at its order's partition
(the usual path: the client routes it there itself) or at the intake (desk commands, and clients
that do not name a partition).

In order: who sent it (the broker-verified ``user_id``; a sender that may send no command is
``Forged`` and dead-lettered), the agent's rate, the body (size, JSON, shape, schema), the routing
key against the command's type (and partition), what the sender's role may send, and for a start
the catalog and plan rules. A refusal is recorded with its rule and answered with a
``command.rejected`` reply built only from well-formed parts of the message, so building the
answer can never fail on the field that was wrong. An accepted command is stamped with its
sender and an id derived from the sender and its own id, so no client can choose an id another
message of the system uses.
"""

from __future__ import annotations

import logging

from aio_pika.abc import AbstractIncomingMessage

from saga_coordinator.authority import may_read, may_send
from saga_coordinator.store import Store
from saga_shared.config import Settings
from saga_shared.errors import InvalidMessage, PlanRejected
from saga_shared.model.catalog import Catalog
from saga_shared.model.gateway import AdmittedPlan, admit
from saga_shared.model.messages import (
    AnyCommand,
    CommandReply,
    DeskCommand,
    Outbound,
    QuerySaga,
    Role,
    StartSaga,
)
from saga_shared.model.text import clean
from saga_shared.security import trust
from saga_shared.security.identity import Directory
from saga_shared.security.ratelimit import TokenBuckets
from saga_shared.transport.bus import Bus
from saga_shared.transport.codec import (
    COMMANDS,
    Identity,
    check_order_header,
    decode_incoming,
    identify_incoming,
    peek,
)
from saga_shared.transport.topology import partition_of

log = logging.getLogger(__name__)
Admitted = AnyCommand | QuerySaga | DeskCommand
# The command, and for a start the plan the gateway admitted (the coordinator's decision takes
# it instead of checking the plan a second time: that was 3% of its CPU per saga).
Examined = tuple[Admitted, AdmittedPlan | None]


class Gatekeeper:
    def __init__(self, settings: Settings, catalog: Catalog, bus: Bus, store: Store) -> None:
        self.settings = settings
        self.catalog = catalog
        self.bus = bus
        self.store = store
        self.directory = Directory.from_settings(settings)
        self.buckets = TokenBuckets(settings.agent_rate, settings.agent_burst)

    async def examine(
        self, delivery: AbstractIncomingMessage, *, partition: int | None = None
    ) -> Examined | None:
        """The command, checked and stamped with its sender, and for a start its admitted plan;
        None when it was refused (recorded and answered). ``partition``: the partition it was
        routed to, if it came that way. Raises ``Forged`` for a sender that may send no command
        at all."""
        user = await self.sender(delivery)
        try:
            role = trust.command_sender(self.directory, user)
        except trust.Forged as exc:
            # The broker vouched for who sent it (user_id): they hear why, as for any refusal,
            # instead of waiting for an answer that never comes; it is still dead-lettered.
            if user is not None:
                await self._reply_refused(delivery, exc.reason)
            raise
        assert user is not None  # command_sender refuses a missing user
        replayed = user != delivery.user_id  # an operator's replay: not the agent's traffic
        # The body's ids (a second JSON parse) are read only for a refusal: an accepted
        # command's come from its validated body.
        try:
            return self._admit(delivery, user, role, counted=not replayed, partition=partition)
        except InvalidMessage as exc:
            await self.refuse(delivery, user, "invalid_message", exc.reason)
        except PlanRejected as exc:
            await self.refuse(delivery, user, exc.rule, str(exc))
        except Exception as exc:  # a bug must not turn one odd command into a blocked order
            log.exception("checking command %s failed", identify_incoming(delivery).message_id)
            reason = f"the gateway could not check this command ({type(exc).__name__})"
            await self.refuse(delivery, user, "internal_error", reason)
        return None

    async def sender(
        self, delivery: AbstractIncomingMessage, ident: Identity | None = None
    ) -> str | None:
        """The broker-verified sender; for a dead letter an operator replayed, the sender it
        had when it first arrived (the coordinator republished it)."""
        user = delivery.user_id
        replay = (delivery.headers or {}).get(trust.REPLAY_HEADER)
        if replay is None or not self.directory.is_coordinator(user):
            return user
        message_id = (ident or identify_incoming(delivery)).message_id
        found, original = await self.store.replayed_sender(replay, message_id)
        if not found:
            raise trust.Forged("a replay that names no dead letter being replayed")
        return original

    def _admit(
        self,
        delivery: AbstractIncomingMessage,
        user: str,
        role: Role,
        *,
        counted: bool,
        partition: int | None,
    ) -> Examined:
        if counted and role == "agent" and not self.buckets.allow(user):
            raise PlanRejected(
                "rate_limited",
                f"{user} sent more than {self.settings.agent_rate:g} commands a second "
                f"(burst {self.settings.agent_burst}); slow down and send again",
            )
        command = decode_incoming(delivery, COMMANDS, self.settings.max_message_bytes)
        check_order_header(delivery, getattr(command, "order_id", None))
        self._check_route(delivery.routing_key or "", command, partition)
        if command.sender is not None:
            raise InvalidMessage("sender: set by the gateway from the broker's user_id, not sent")
        if command.reply_to and command.reply_to.startswith(f"{self.settings.namespace}."):
            raise PlanRejected("reply_to", f"reply_to {command.reply_to!r} is a system queue")
        sender = trust.acting_sender(self.directory, user, role, delivery.headers)
        refused = may_send(sender.role, command.type)
        if refused is not None:
            raise PlanRejected("not_permitted", refused)
        plan = admit(self.catalog, command) if isinstance(command, StartSaga) else None
        return command.model_copy(update={"sender": sender}), plan

    def _check_route(self, key: str, command: Admitted, partition: int | None) -> None:
        """At the intake a command comes under its type; at a partition, under its type and the
        partition of its order (``saga.start.3``), which the client computes (crc32 % N)."""
        expected: str
        if partition is None:
            expected = command.type
        elif isinstance(command, DeskCommand):
            raise PlanRejected("routing_key", f"publish {command.type} with routing key "
                               f"{command.type!r}, to the intake")  # fmt: skip
        else:
            expected = f"{command.type}.{partition_of(command.order_id, self.settings.partitions)}"
        if key != expected:
            raise PlanRejected(
                "routing_key",
                f"published with routing key {clean(key, 80)!r}; publish {command.type} "
                f"with routing key {expected!r}",
            )

    async def refuse(
        self,
        delivery: AbstractIncomingMessage,
        user: str,
        rule: str,
        reason: str,
    ) -> None:
        ident = identify_incoming(delivery)
        reason = clean(reason, 2000)
        log.warning("refused command %s from %s (%s): %s", ident.message_id, user, rule, reason)
        await self.store.record_rejection(
            ident, sender=user, rule=rule, reason=reason, body=delivery.body,
            keep_bytes=self.settings.max_message_bytes,
        )  # fmt: skip
        await self._reply_refused(delivery, reason)

    async def _reply_refused(self, delivery: AbstractIncomingMessage, reason: str) -> None:
        ident = identify_incoming(delivery)
        ids = peek(delivery.body)
        reply_to = ids["reply_to"]
        if reply_to is None or reply_to.startswith(f"{self.settings.namespace}."):
            return
        reply = CommandReply(
            type="command.rejected",
            saga_id=ids["saga_id"] or "unknown",
            order_id=ids["order_id"] or "unknown",
            command_id=ident.message_id,
            command_type=ids["type"] or "unknown",
            reason=reason,
        )
        await self.publish_reply(reply_to, reply)

    async def answer(self, query: QuerySaga) -> None:
        """A status query reads the register; it goes nowhere near the convoy. An agent may
        read only the sagas it started."""
        if query.reply_to is None:
            return
        state = await self.store.get(query.saga_id)
        if state is not None and not may_read(state, query.sender):
            state = None  # as if there were none: an agent learns nothing of others' sagas
        reply = CommandReply(
            type="command.accepted" if state is not None else "command.rejected",
            saga_id=query.saga_id,
            order_id=query.order_id,
            command_id=query.message_id,
            command_type=query.type,
            reason="" if state is not None else f"no saga {query.saga_id}",
            saga_register=None if state is None else state.register(),
        )
        await self.publish_reply(query.reply_to, reply)

    async def publish_reply(self, reply_to: str | None, reply: Outbound) -> None:
        if reply_to is None:
            return
        try:
            await self.bus.publish("", reply_to, reply)
        except Exception as exc:  # the agent's reply queue is gone; the outcome is recorded
            log.warning("could not reply to %s: %r", reply_to, exc)


def stamped(command: AnyCommand, seq: int | None = None) -> AnyCommand:
    """The command as the coordinator applies it: under the id derived from its sender, with
    the client's id kept for the replies."""
    assert command.sender is not None
    message_id = trust.forwarded_id(command.sender.user, command.message_id)
    return command.model_copy(
        update={"seq": seq, "message_id": message_id, "client_message_id": command.message_id}
    )
