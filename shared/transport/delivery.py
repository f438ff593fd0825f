"""Ack, requeue or dead-letter: decided here and nowhere else.

Handlers never touch the delivery; they return or raise a typed exception, and ``decide`` (pure)
maps that to an outcome. ``reject`` (not ``nack``) is used for requeues because from RabbitMQ 4.3
only ``reject`` raises the delivery count that sends a poison message to the dead letters.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from aio_pika.abc import AbstractIncomingMessage

from saga_shared.errors import DeliveryLimitReached, InvalidMessage, RetryLater
from saga_shared.model.text import header_text
from saga_shared.observability.logs import context
from saga_shared.transport.handoff import is_local

log = logging.getLogger(__name__)

Handler = Callable[[AbstractIncomingMessage], Awaitable[None]]
# Told of every failure before the delivery is settled: records the error (for the dead letter)
# and blocks the message's order, so later messages of the order wait instead of overtaking it.
FailureHook = Callable[[AbstractIncomingMessage, BaseException, "Outcome"], Awaitable[None]]


class Outcome(StrEnum):
    ACK = "ack"
    RETRY = "retry"  # requeue; the queue's delivery limit dead-letters it if it keeps failing
    DEAD_LETTER = "dead_letter"  # can never work: straight to the dead letters


def decide(error: BaseException | None) -> Outcome:
    if error is None:
        return Outcome.ACK
    if isinstance(error, InvalidMessage | DeliveryLimitReached):
        return Outcome.DEAD_LETTER
    if isinstance(error, RetryLater):
        return Outcome.RETRY
    # An unexpected bug may be transient too; the delivery limit bounds the retries.
    return Outcome.RETRY


# A burial the broker refused (the dead letters' queue without a majority) waits this long before
# its message goes back to the queue.
BURY_RETRY_S = 1.0
# A queue that does not dead-letter for itself (a classic queue): publishes the message to the
# dead letters with a confirm (saga_shared.transport.poison.Poison.bury); the ack follows.
Bury = Callable[[AbstractIncomingMessage], Awaitable[None]]


async def settle(
    message: AbstractIncomingMessage, outcome: Outcome, bury: Bury | None = None
) -> None:
    if outcome is Outcome.ACK:
        await message.ack()
    elif outcome is Outcome.RETRY:
        await message.reject(requeue=True)
    elif bury is not None:
        try:
            await bury(message)
        except Exception as exc:  # kept, never dropped: back in the queue, buried next time
            log.warning("message %s could not be dead-lettered (%r); requeued in %.0f s",
                        message.message_id, exc, BURY_RETRY_S)  # fmt: skip
            await asyncio.sleep(BURY_RETRY_S)
            await message.reject(requeue=True)
            return
        await message.ack()
    else:
        await message.reject(requeue=False)


Settle = Callable[[AbstractIncomingMessage, Outcome], Awaitable[None]]


class Acks:
    """Settles the deliveries of one sequential consumer, coalescing its acks: while further
    deliveries wait in hand, an ack is held back and the next one covers it (``multiple=True``,
    one frame and one broker operation for up to ``most``). A held ack is sent before any reject
    and whenever nothing waits, so it never lingers behind an idle queue. Holding one back is
    safe: until it is sent the broker would redeliver the message, which the handlers absorb
    (the inbox, the idempotency keys), exactly as after a crash between commit and ack."""

    def __init__(self, waiting: Callable[[], bool], most: int = 32) -> None:
        self.waiting = waiting
        self.most = most
        self._held: AbstractIncomingMessage | None = None
        self._count = 0

    async def settle(self, message: AbstractIncomingMessage, outcome: Outcome) -> None:
        if outcome is not Outcome.ACK:
            await self.flush()
            await settle(message, outcome)
            return
        if is_local(message):  # handed over in this process: no ack of the broker's covers it
            await message.ack()
            if not self.waiting():
                await self.flush()
            return
        self._held, self._count = message, self._count + 1
        if self._count >= self.most or not self.waiting():
            await self.flush()

    async def flush(self) -> None:
        held, count = self._held, self._count
        self._held, self._count = None, 0
        if held is not None:
            await held.ack(multiple=count > 1)


def _judge(message: AbstractIncomingMessage, exc: Exception) -> Outcome:
    """One line per failed delivery, with the error; the traceback only when the message goes
    to the dead letters (or at DEBUG): a retried delivery is not an 80-line event."""
    outcome = decide(exc)
    retried = outcome is Outcome.RETRY
    traceback = not isinstance(exc, InvalidMessage | RetryLater | DeliveryLimitReached) and (
        not retried or log.isEnabledFor(logging.DEBUG)
    )
    headers = message.headers or {}
    log.log(
        logging.WARNING if retried else logging.ERROR,
        "message %s (%s) on %s: %r -> %s",
        message.message_id,
        message.type,
        message.routing_key,
        exc,
        outcome.value,
        exc_info=traceback,
        extra=context(
            message_id=message.message_id, order_id=header_text(headers.get("x-order-id"))
        ),
    )
    return outcome


async def _told(
    on_failure: FailureHook | None,
    message: AbstractIncomingMessage,
    exc: BaseException,
    outcome: Outcome,
) -> None:
    if on_failure is not None:
        try:
            await on_failure(message, exc, outcome)
        except Exception:
            log.warning("could not record the failure of %s", message.message_id, exc_info=True)


async def deliver(
    message: AbstractIncomingMessage,
    handler: Handler,
    on_failure: FailureHook | None = None,
    settle_with: Settle | None = None,
) -> Outcome:
    """Run one handler on one delivery and settle it (``settle_with``: how, by default at
    once). Cancellation leaves it unsettled: the broker redelivers it when the channel closes,
    which is what a graceful stop wants."""
    try:
        await handler(message)
    except Exception as exc:
        outcome = _judge(message, exc)
        await _told(on_failure, message, exc, outcome)
    else:
        outcome = Outcome.ACK
    await (settle_with or settle)(message, outcome)
    return outcome


@dataclass(frozen=True)
class Alone:
    """A batch handler's verdict for a delivery it could not finish with the others (a retry
    with backoff, a batch that failed as a whole): ``handler`` finishes it on its own, as a
    concurrent consumer would, so the slow one never holds up its batch."""

    handler: Handler | None = None  # None: the consumer's own per-delivery handler


# Per delivery, in order: None (done), the error it raised, or Alone.
BatchHandler = Callable[[Sequence[AbstractIncomingMessage]], Awaitable[list["BatchVerdict"]]]
BatchVerdict = BaseException | Alone | None


class InHand:
    """The deliveries of one consumer's channel not yet settled, so that one ack with
    ``multiple=True`` is sent only when it covers nothing but the acks it stands for."""

    def __init__(self, bury: Bury | None = None) -> None:
        self._tags: set[int] = set()
        self.bury = bury

    def add(self, message: AbstractIncomingMessage) -> None:
        self._tags.add(message.delivery_tag or 0)

    async def settle(self, message: AbstractIncomingMessage, outcome: Outcome) -> None:
        self._tags.discard(message.delivery_tag or 0)
        await settle(message, outcome, self.bury)

    async def ack_all(self, messages: Sequence[AbstractIncomingMessage]) -> None:
        tags = {m.delivery_tag or 0 for m in messages}
        top = max(messages, key=lambda m: m.delivery_tag or 0)
        below = any(t < (top.delivery_tag or 0) for t in self._tags - tags)
        self._tags -= tags
        if below or len(messages) == 1:
            for message in messages:
                await message.ack()
        else:
            await top.ack(multiple=True)


async def deliver_batch(
    messages: Sequence[AbstractIncomingMessage],
    handler: BatchHandler,
    in_hand: InHand,
    spawn: Callable[[AbstractIncomingMessage, Handler | None], object],
    on_failure: FailureHook | None = None,
) -> None:
    """Run a batch handler and settle its deliveries: rejects one by one, every ack in one
    frame where no other delivery in hand lies below it, each ``Alone`` handed to ``spawn``.
    A batch handler that raises has failed each of its deliveries alike."""
    try:
        verdicts = await handler(messages)
    except Exception as exc:
        verdicts = [exc] * len(messages)
    if len(verdicts) != len(messages):
        bug = RuntimeError(f"a batch handler gave {len(verdicts)} verdicts for {len(messages)}")
        verdicts = [bug] * len(messages)
    acks: list[AbstractIncomingMessage] = []
    for message, verdict in zip(messages, verdicts, strict=True):
        if verdict is None:
            acks.append(message)
        elif isinstance(verdict, Alone):
            spawn(message, verdict.handler)
        elif isinstance(verdict, Exception):
            outcome = _judge(message, verdict)
            await _told(on_failure, message, verdict, outcome)
            await in_hand.settle(message, outcome)
        else:
            raise verdict  # cancellation and the like are not a delivery's failure
    if acks:
        await in_hand.ack_all(acks)
