"""The intake, where the gateway stands: every command is checked here before it reaches the
order's partition.

In order: who sent it (the broker-verified ``user_id``; a sender that may send no command is
``Forged`` and dead-lettered), the agent's rate, the body (size, JSON, shape, schema), the routing
key against the command's type, what the sender's role may send, and for a start the catalog and
plan rules. A refusal is recorded with its rule and answered with a ``command.rejected`` reply
built only from well-formed parts of the message, so building the answer can never fail on the
field that was wrong. An accepted command is numbered in its order's arrival order and forwarded
under an id derived from its sender and its own id.
"""

from __future__ import annotations

import logging

from aio_pika.abc import AbstractIncomingMessage

from saga_coordinator.authority import may_send
from saga_coordinator.desk import DeadLetterDesk
from saga_coordinator.store import Store
from shared import trust
from shared.bus import Bus
from shared.catalog import Catalog
from shared.codec import COMMANDS, Identity, decode_incoming, identify_incoming, peek
from shared.config import Settings
from shared.errors import InvalidMessage, PlanRejected
from shared.failures import failure_recorder
from shared.gateway import admit
from shared.identity import Directory
from shared.messages import (
    AnyCommand,
    CommandReply,
    DeskCommand,
    Outbound,
    QuerySaga,
    Role,
    Sender,
    StartSaga,
)
from shared.ratelimit import TokenBuckets
from shared.text import clean

log = logging.getLogger(__name__)
Admitted = AnyCommand | QuerySaga | DeskCommand


class Intake:
    def __init__(
        self,
        settings: Settings,
        catalog: Catalog,
        bus: Bus,
        store: Store,
        desk: DeadLetterDesk | None = None,
    ) -> None:
        self.settings = settings
        self.catalog = catalog
        self.bus = bus
        self.store = store
        self.desk = desk
        self.directory = Directory.from_settings(settings)
        self.buckets = TokenBuckets(settings.agent_rate, settings.agent_burst)

    async def handle(self, delivery: AbstractIncomingMessage) -> None:
        ident = identify_incoming(delivery)
        user = await self._sender(delivery, ident)
        role = trust.command_sender(self.directory, user)  # Forged: dead-lettered
        assert user is not None  # command_sender refuses a missing user
        replayed = user != delivery.user_id  # an operator's replay: not the agent's traffic
        try:
            command = self._admit(delivery, user, role, counted=not replayed)
        except InvalidMessage as exc:
            await self._refuse(delivery, ident, user, "invalid_message", exc.reason)
            return
        except PlanRejected as exc:
            await self._refuse(delivery, ident, user, exc.rule, str(exc))
            return
        except Exception as exc:  # a bug must not turn one odd command into a blocked order
            log.exception("checking command %s failed", ident.message_id)
            reason = f"the gateway could not check this command ({type(exc).__name__})"
            await self._refuse(delivery, ident, user, "internal_error", reason)
            return
        if isinstance(command, QuerySaga):
            await self._answer(command)
        elif isinstance(command, DeskCommand):
            assert self.desk is not None, "desk commands need the desk"
            await self._publish_reply(command.reply_to, await self.desk.perform(command))
        else:
            await self._forward(command)

    async def _sender(self, delivery: AbstractIncomingMessage, ident: Identity) -> str | None:
        """The broker-verified sender; for a dead letter an operator replayed, the sender it
        had when it first arrived (the coordinator republished it)."""
        user = delivery.user_id
        replay = (delivery.headers or {}).get(trust.REPLAY_HEADER)
        if replay is None or not self.directory.is_coordinator(user):
            return user
        found, original = await self.store.replayed_sender(replay, ident.message_id)
        if not found:
            raise trust.Forged("a replay that names no dead letter being replayed")
        return original

    def _admit(
        self, delivery: AbstractIncomingMessage, user: str, role: Role, *, counted: bool
    ) -> Admitted:
        if counted and role == "agent" and not self.buckets.allow(user):
            raise PlanRejected(
                "rate_limited",
                f"{user} sent more than {self.settings.agent_rate:g} commands a second "
                f"(burst {self.settings.agent_burst}); slow down and send again",
            )
        command = decode_incoming(delivery, COMMANDS, self.settings.max_message_bytes)
        if delivery.routing_key != command.type:
            raise PlanRejected(
                "routing_key",
                f"published with routing key {clean(delivery.routing_key or '', 80)!r}; "
                f"publish {command.type} with routing key {command.type!r}",
            )
        if command.sender is not None:
            raise InvalidMessage("sender: set by the intake from the broker's user_id, not sent")
        if command.reply_to and command.reply_to.startswith(f"{self.settings.namespace}."):
            raise PlanRejected("reply_to", f"reply_to {command.reply_to!r} is a system queue")
        refused = may_send(role, command.type)
        if refused is not None:
            raise PlanRejected("not_permitted", refused)
        if isinstance(command, StartSaga):
            admit(self.catalog, command)
        return command.model_copy(update={"sender": Sender(user=user, role=role)})

    async def _forward(self, command: AnyCommand) -> None:
        """Numbered first, so a command that fails later keeps its place in its order; then sent
        to the partition under the intake's own id for it (a re-sent or redelivered command gets
        the same id and number, and the inbox absorbs it)."""
        assert command.sender is not None
        message_id = trust.forwarded_id(command.sender.user, command.message_id)
        seq = await self.store.assign_seq(message_id, command.order_id)
        forwarded = command.model_copy(
            update={"seq": seq, "message_id": message_id, "client_message_id": command.message_id}
        )
        await self.bus.to_partition(forwarded)

    async def _answer(self, query: QuerySaga) -> None:
        """A status query reads the register; it goes nowhere near the convoy. An agent may
        read only the sagas it started."""
        if query.reply_to is None:
            return
        state = await self.store.get(query.saga_id)
        sender = query.sender
        if state is not None and sender is not None and sender.role == "agent":
            owner = state.started_by
            if owner is None or owner.user != sender.user:
                state = None
        reply = CommandReply(
            type="command.accepted" if state is not None else "command.rejected",
            saga_id=query.saga_id,
            order_id=query.order_id,
            command_id=query.message_id,
            command_type=query.type,
            reason="" if state is not None else f"no saga {query.saga_id}",
            saga_register=None if state is None else state.register(),
        )
        await self._publish_reply(query.reply_to, reply)

    async def _refuse(
        self,
        delivery: AbstractIncomingMessage,
        ident: Identity,
        user: str,
        rule: str,
        reason: str,
    ) -> None:
        reason = clean(reason, 2000)
        log.warning("refused command %s from %s (%s): %s", ident.message_id, user, rule, reason)
        await self.store.record_rejection(
            ident, sender=user, rule=rule, reason=reason, body=delivery.body,
            keep_bytes=self.settings.max_message_bytes,
        )  # fmt: skip
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
        await self._publish_reply(reply_to, reply)

    async def _publish_reply(self, reply_to: str | None, reply: Outbound) -> None:
        if reply_to is None:
            return
        try:
            await self.bus.publish("", reply_to, reply)
        except Exception as exc:  # the agent's reply queue is gone; the outcome is recorded
            log.warning("could not reply to %s: %r", reply_to, exc)

    async def run(self) -> None:
        queue = self.bus.topology.intake_queue
        await self.bus.consume(
            queue,
            self.handle,
            # One command in hand at a time: a command that fails goes back to the head of the
            # queue and is numbered before the ones behind it, so the order's commands keep the
            # order they arrived in. (Blocking the order instead would deadlock with the
            # numbering: the blocked command could wait for a number given to a later one.)
            prefetch=1,
            mode="sequential",
            on_failure=failure_recorder(self.store.pool, queue, block_order=False),
        )
