"""The people and programs that send commands in the simulation: agents starting and aborting
sagas, people deciding at gates and settling steps in doubt, an operator resuming and replaying
dead letters, and a rogue agent sending what it may not. Each sends a command as the client
library does (``saga_shared.client``): with a reply queue, under one message id, sent again under
the
same id until it is answered; so every command is known to have been answered, or not."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pydantic import TypeAdapter

from saga_app.sim.bus import SimBus
from saga_app.sim.clients import Connection
from saga_app.sim.errors import BrokerDown
from saga_app.sim.messages import FakeDelivery
from saga_shared.model.messages import AnyCommand, CommandReply, QuerySaga
from saga_shared.security.trust import ON_BEHALF_HEADER
from saga_shared.transport.codec import message_to_amqp

if TYPE_CHECKING:
    from saga_app.sim.world import World

_REPLY: TypeAdapter[CommandReply] = TypeAdapter(CommandReply)
RESEND_S = 2.0


class Sender:
    """One account that sends commands: its connection and reply queue, opened again after
    the broker went away."""

    def __init__(self, world: World, user: str, *, on_behalf_of: str | None = None) -> None:
        self.world = world
        self.user = user
        self.person = on_behalf_of
        self.connection: Connection | None = None
        self.lives = 0
        self.waiting: dict[str, asyncio.Future[CommandReply]] = {}

    def _connect(self) -> Connection:
        if self.connection is not None and not self.connection.closed:
            return self.connection
        w = self.world
        self.lives += 1
        connection = w.broker.connect(user=self.user, name=f"{self.user}#{self.lives}")
        self.reply_to = f"sim.replies.{self.user}.{self.lives}"
        w.broker.declare_client_queue(self.reply_to, owner=connection)
        connection.consume(self.reply_to, self._on_reply)
        self.connection = connection
        return connection

    async def _on_reply(self, delivery: FakeDelivery) -> None:
        reply = _REPLY.validate_json(delivery.body)
        await delivery.ack()
        self.world.answered(reply)
        future = self.waiting.get(reply.command_id)
        if future is not None and not future.done():
            future.set_result(reply)

    async def send(
        self, command: AnyCommand | QuerySaga, *, copies: int = 1, patience_s: float = 3600.0
    ) -> CommandReply | None:
        """Send ``command`` (``copies`` times at once), then again under the same id every
        ``RESEND_S`` until it is answered; None when ``patience_s`` ran out."""
        future: asyncio.Future[CommandReply] = asyncio.get_running_loop().create_future()
        self.waiting[command.message_id] = future
        loop = asyncio.get_running_loop()
        give_up = loop.time() + patience_s
        try:
            while not future.done() and loop.time() < give_up:
                for _ in range(copies):
                    self._publish(command)
                copies = 1
                await asyncio.wait([future], timeout=RESEND_S)
            return future.result() if future.done() else None
        finally:
            self.waiting.pop(command.message_id, None)

    def _publish(self, command: AnyCommand | QuerySaga) -> None:
        w = self.world
        try:
            connection = self._connect()
            sent = command.model_copy(update={"reply_to": self.reply_to})
            headers = {ON_BEHALF_HEADER: self.person} if self.person else None
            bus = SimBus(connection, w.topology, w.settings)
            key = w.topology.command_key(command.type, command.order_id)
            future = bus.send(w.topology.commands_exchange, key, message_to_amqp(sent, headers))
            future.add_done_callback(_quietly)
            w.sent_command(self.user, sent)
        except BrokerDown:
            pass  # the broker is away: the next resend tries again

    def raw(self, exchange: str, key: str, message: Any) -> bool:
        """Publish anything (the rogue agent's forgeries), as this account; whether the broker
        took it (it may still lose it in a crash)."""
        try:
            bus = SimBus(self._connect(), self.world.topology, self.world.settings)
            bus.send(exchange, key, message).add_done_callback(_quietly)
        except Exception as exc:  # refused at the door (a user_id that is not its own), or down
            self.world.note(self.user, f"could not publish: {type(exc).__name__}: {exc}")
            return False
        return True


def _quietly(future: asyncio.Future[None]) -> None:
    """A confirm nobody waits for: its failure is seen as the missing answer."""
    if not future.cancelled():
        future.exception()


Script = Callable[[], Any]
