"""Sending one command until it is answered: the agents' side of "every command gets an
answer" (``SagaClient`` is its caller).

A command not answered is sent again, with the same message id and the same body, every
``ResendSchedule`` pause until an answer comes or the bound passes; the coordinator answers a
message id it has seen with the reply it gave the first time, so a resend has one effect. What can
happen, each its own type (``saga_shared.model.answers``): the answer; ``NotAnswered`` (sent: the
broker confirmed it holds it, or may have taken it, and no answer came in time: it is applied when
the coordinator runs, and sending it again with the same message id is safe); ``BrokerUnreachable``
(nothing was sent, so nothing will happen); ``MessageIdReused`` (the answer is another
command's)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import aiormq

from saga_shared.errors import SagaError
from saga_shared.model.answers import (
    BrokerUnreachable,
    MessageIdReused,
    NotAnswered,
    ResendSchedule,
    Tally,
    cause_of,
    seconds_text,
    times,
)
from saga_shared.model.messages import (
    Command,
    CommandReply,
    DeskReply,
    DiscardDeadLetter,
    ReplayDeadLetters,
)
from saga_shared.observability import tracing
from saga_shared.security.trust import ON_BEHALF_HEADER
from saga_shared.transport.bus import Bus, refused_for_now, unroutable

# What going wrong on the way to the broker looks like: the socket's errors (aiormq's
# connection errors are OSErrors), a bound that passed, a channel closed under the client.
CONNECTION_TROUBLE = (OSError, TimeoutError, aiormq.exceptions.ChannelInvalidStateError)
# A publish that raised one of these left nothing with the broker: the channel was closed
# before the frames were written (aiormq checks under its lock), or the bus was not connected.
_NOT_WRITTEN = (aiormq.exceptions.ChannelInvalidStateError, RuntimeError)
# And these, after the frames may have been written: the broker may hold the command.
_MAYBE_WRITTEN = (OSError, TimeoutError, aiormq.exceptions.AMQPError)


class Courier:
    """Sends commands to the commands exchange and pairs each with its answer, which the
    owner hands in (``answered``) from its reply queue."""

    def __init__(self, bus: Bus, resend: ResendSchedule) -> None:
        self.bus = bus
        self.resend = resend
        self.pending: dict[str, asyncio.Future[CommandReply | DeskReply]] = {}

    def answered(self, reply: CommandReply | DeskReply) -> None:
        future = self.pending.get(reply.command_id)
        if future is not None and not future.done():
            future.set_result(reply)

    async def request(
        self, command: Command, within: float, *, person: str | None = None, traced: bool = True
    ) -> CommandReply | DeskReply:
        """Send ``command`` until it is answered or ``within`` seconds pass (see the module's
        text); ``person``: the one it is sent for (the console's signed-in people); not
        ``traced``: the client's own look-up, with no span of its own in the saga's trace."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        future: asyncio.Future[CommandReply | DeskReply] = loop.create_future()
        self.pending[command.message_id] = future
        tally = Tally()
        pauses = self.resend.pauses()
        try:
            while True:
                await self._send_once(
                    command, person, future, deadline - loop.time(), tally, traced=traced
                )
                if not future.done():
                    pause = min(next(pauses), deadline - loop.time())
                    if pause > 0:
                        await asyncio.wait([future], timeout=pause)
                if future.done():
                    return self._checked(command, future.result())
                if loop.time() >= deadline:
                    break
        finally:
            self.pending.pop(command.message_id, None)
        raise self._unanswered(command, tally, within)

    async def _send_once(
        self,
        command: Command,
        person: str | None,
        answered: asyncio.Future[CommandReply | DeskReply],
        left_s: float,
        tally: Tally,
        *,
        traced: bool = True,
    ) -> None:
        """One publish, over by the answer or the bound; ``tally`` says what became of it."""
        if left_s <= 0:
            return
        if not self._connection_up():
            # Down (a robust connection comes back by itself): nothing could be written.
            tally.trouble = ConnectionError("the connection to RabbitMQ is down")
            return
        publish: asyncio.Future[None] = asyncio.ensure_future(
            self._publish(command, person, traced)
        )
        racing: list[asyncio.Future[Any]] = [publish, answered]
        done, _ = await asyncio.wait(racing, timeout=left_s, return_when=asyncio.FIRST_COMPLETED)
        if publish not in done:
            # The answer came first (so a copy was taken), or the bound passed while the
            # confirm was awaited: either way the broker may hold it.
            publish.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await publish
            tally.sends += 1
            if not answered.done():
                tally.trouble = TimeoutError("no confirm from the broker")
            return
        failed = publish.exception()
        if failed is None:
            tally.sends += 1
            tally.confirmed += 1
            return
        if isinstance(failed, aiormq.exceptions.ChannelAccessRefused) or unroutable(failed):
            raise failed  # it can never succeed: the broker says so at once
        if not isinstance(failed, _NOT_WRITTEN + _MAYBE_WRITTEN):
            raise failed  # not the transport's trouble: a fault to see, not to send again
        tally.trouble = failed
        if refused_for_now(failed):
            tally.refused += 1
        elif not isinstance(failed, _NOT_WRITTEN):
            tally.sends += 1  # written, then the connection failed: the broker may hold it

    def _connection_up(self) -> bool:
        if not self.bus.connected:
            return False
        up = getattr(self.bus.connection, "connected", None)  # aio-pika's event, when it has one
        return not isinstance(up, asyncio.Event) or up.is_set()

    async def _publish(self, command: Command, person: str | None, traced: bool) -> None:
        order_id = getattr(command, "order_id", None) or ""
        saga_id = getattr(command, "saga_id", "")
        span = tracing.current(
            f"send {command.type}", kind=tracing.SpanKind.PRODUCER,
            attributes=lambda: tracing.attributes(saga_id, order_id),
        ) if traced else contextlib.nullcontext()  # fmt: skip
        with span:
            headers = tracing.headers_of() if traced else {}
            if person is not None:
                headers[ON_BEHALF_HEADER] = person
            await self.bus.publish(
                self.bus.topology.commands_exchange, self._routing_key(command), command, headers
            )

    def _checked(
        self, command: Command, reply: CommandReply | DeskReply
    ) -> CommandReply | DeskReply:
        """The reply, unless it is the reply to another command sent under the same id."""
        other_type = reply.command_type not in (command.type, "unknown")
        saga_id = getattr(command, "saga_id", None)
        reply_saga = getattr(reply, "saga_id", None)
        other_saga = saga_id is not None and reply_saga not in (None, saga_id, "unknown")
        if other_type or other_saga:
            raise MessageIdReused(command, reply)
        return reply

    def _unanswered(self, command: Command, tally: Tally, within: float) -> SagaError:
        saga_id = getattr(command, "saga_id", None)
        order_id = getattr(command, "order_id", None)
        if tally.sends:
            return NotAnswered(
                command_type=command.type, message_id=command.message_id, saga_id=saga_id,
                order_id=order_id, sends=tally.sends, queued=tally.confirmed > 0,
                within_s=within,
            )  # fmt: skip
        trouble = tally.trouble
        cause = cause_of(trouble) if trouble is not None else "no time left to send it"
        if tally.refused:
            cause = f"it refused it {times(tally.refused)}, for now: {cause}"
        else:
            cause = f"{cause}, for {seconds_text(within)} s"
        return BrokerUnreachable(
            url=self.bus.url, cause=cause, within_s=within, reached=tally.refused > 0,
            command_type=command.type, message_id=command.message_id, saga_id=saga_id,
            order_id=order_id,
        )  # fmt: skip

    def _routing_key(self, command: Command) -> str:
        """A command of an order goes straight to its partition; a desk command goes to the
        intake under its bare type, even when it names an order (only ``saga.*.N`` is bound to
        the partitions)."""
        if isinstance(command, ReplayDeadLetters | DiscardDeadLetter):
            return command.type
        return self.bus.topology.command_key(command.type, command.order_id)
