"""The intake, where the gateway stands: every agent command is validated here (schema, catalog,
plan rules) before it reaches the order's partition. A refusal is recorded, answered with a
``command.rejected`` reply naming the rule, and goes no further."""

from __future__ import annotations

import contextlib
import logging

from aio_pika.abc import AbstractIncomingMessage

from saga_coordinator.store import Store
from shared.bus import Bus
from shared.catalog import Catalog
from shared.codec import COMMANDS, decode_incoming, peek
from shared.config import Settings
from shared.errors import InvalidMessage, PlanRejected
from shared.failures import failure_recorder
from shared.gateway import admit
from shared.messages import CommandReply, QuerySaga, StartSaga

log = logging.getLogger(__name__)


class Intake:
    def __init__(self, settings: Settings, catalog: Catalog, bus: Bus, store: Store) -> None:
        self.settings = settings
        self.catalog = catalog
        self.bus = bus
        self.store = store

    async def handle(self, delivery: AbstractIncomingMessage) -> None:
        try:
            command = decode_incoming(delivery, COMMANDS, self.settings.max_message_bytes)
            if isinstance(command, QuerySaga):
                await self._answer(command)
                return
            if isinstance(command, StartSaga):
                admit(self.catalog, command)
        except InvalidMessage as exc:
            await self._refuse(delivery.body, "invalid_message", exc.reason)
            return
        except PlanRejected as exc:
            await self._refuse(delivery.body, exc.rule, str(exc))
            return
        # The order's command number travels with the command; the partition keeps the message
        # id, so a re-forwarded duplicate (crash before the ack) is absorbed by the inbox.
        seq = await self.store.assign_seq(command.message_id, command.order_id)
        await self.bus.to_partition(command.model_copy(update={"seq": seq}))

    async def _answer(self, query: QuerySaga) -> None:
        """A status query reads the register; it goes nowhere near the convoy."""
        if query.reply_to is None:
            return
        state = await self.store.get(query.saga_id)
        reply = CommandReply(
            type="command.accepted" if state is not None else "command.rejected",
            saga_id=query.saga_id,
            order_id=query.order_id,
            command_id=query.message_id,
            command_type=query.type,
            reason="" if state is not None else f"no saga {query.saga_id}",
            saga_register=None if state is None else state.register(),
        )
        with contextlib.suppress(Exception):  # the agent's reply queue may be gone
            await self.bus.publish("", query.reply_to, reply)

    async def _refuse(self, body: bytes, rule: str, reason: str) -> None:
        ids = peek(body)
        log.warning("refused command %s (%s): %s", ids["message_id"], rule, reason)
        await self.store.record_rejection(ids=ids, rule=rule, reason=reason, body=body)
        reply_to = ids["reply_to"]
        if reply_to is None:
            return
        reply = CommandReply(
            type="command.rejected",
            saga_id=ids["saga_id"] or "unknown",
            order_id=ids["order_id"] or "unknown",
            command_id=ids["message_id"] or "unknown",
            command_type=ids["type"] or "unknown",
            reason=reason,
        )
        try:
            await self.bus.publish("", reply_to, reply)
        except Exception:  # the agent's reply queue is gone; the rejection is recorded anyway
            log.warning("could not reply to %s", reply_to, exc_info=True)

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
