"""The dead-letter ingester: every dead letter is stored in Postgres, whatever its bytes.

Each letter is judged the way its consumer judged it (the same decoding and the same sender checks,
``saga_shared.security.trust``): only a valid message from its rightful sender, which a handler kept
failing on, blocks its order. Garbage and forgeries are stored and never block anything; a forgery
raises an ``alert.forged`` event. The row is committed before the ack (a crash in between redelivers
the letter, and the same row absorbs it).

The path itself cannot be poisoned: headers and ids are cleaned before they touch a text column,
the body is kept as bytes, and a letter the ingester still cannot store is kept as bare bytes
(``unstorable``, with an alert); after ``delivery_limit`` failed deliveries even of that, it is
moved to the last-resort queue. No letter is redelivered for ever.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aio_pika
from aio_pika.abc import AbstractIncomingMessage
from pydantic import TypeAdapter

from saga_coordinator.rows import OutboxRow
from saga_coordinator.store import Store, Tx
from saga_shared.config import Settings
from saga_shared.errors import InvalidMessage, RetryLater
from saga_shared.model.messages import ActionRequest, Alert, DeskCommand, QuerySaga
from saga_shared.model.text import clean, header_text
from saga_shared.observability import logs, metrics
from saga_shared.security import trust
from saga_shared.security.identity import Directory
from saga_shared.storage.sql import Queries
from saga_shared.transport.bus import Bus
from saga_shared.transport.codec import (
    COMMANDS,
    PARTITION,
    Identity,
    check_order_header,
    decode_incoming,
    identify_incoming,
)
from saga_shared.transport.poison import DEAD_HEADER
from saga_shared.transport.topology import partition_of

log = logging.getLogger(__name__)
Q = Queries(Path(__file__).with_name("dead_letters.sql"))
REPLAY_HEADER = trust.REPLAY_HEADER
_REQUEST: TypeAdapter[ActionRequest] = TypeAdapter(ActionRequest)
MAX_HEADER_DEPTH = 8


@dataclass(frozen=True)
class Death:
    """Where a message was going and why it died, read from the broker's x-death headers."""

    reason: str
    queue: str | None
    exchange: str
    routing_key: str
    count: int
    at: datetime


def read_death(headers: dict[str, Any], now: datetime) -> Death:
    ours = headers.get(DEAD_HEADER)
    if isinstance(ours, dict):  # buried by the consumer of a classic queue
        count, at = ours.get("count"), ours.get("time")
        return Death(
            reason=header_text(ours.get("reason")) or "unknown",
            queue=header_text(ours.get("queue")) or None,
            exchange=header_text(ours.get("exchange")) or "",
            routing_key=header_text(ours.get("routing-key")) or "",
            count=count if isinstance(count, int) and 0 < count < 2**31 else 1,
            at=at if isinstance(at, datetime) else now,
        )
    deaths = [d for d in headers.get("x-death") or [] if isinstance(d, dict)]
    queue = header_text(headers.get("x-first-death-queue"))
    entry = next(
        (d for d in deaths if header_text(d.get("queue")) == queue), deaths[-1] if deaths else {}
    )
    keys = entry.get("routing-keys") or [""]
    at = entry.get("time")
    count = entry.get("count")
    return Death(
        reason=header_text(headers.get("x-first-death-reason"))
        or header_text(entry.get("reason"))
        or "unknown",
        queue=queue or header_text(entry.get("queue")),
        exchange=header_text(entry.get("exchange"))
        or header_text(headers.get("x-first-death-exchange"))
        or "",
        routing_key=header_text(keys[0] if isinstance(keys, list) and keys else "") or "",
        count=count if isinstance(count, int) and 0 < count < 2**31 else 1,
        at=at if isinstance(at, datetime) else now,
    )


def jsonable_headers(headers: dict[str, Any]) -> str:
    """Headers as JSON Postgres accepts: strings cleaned, nesting cut, anything odd as text."""

    def convert(value: Any, depth: int) -> Any:
        if depth > MAX_HEADER_DEPTH:
            return "(nested too deeply)"
        if isinstance(value, bytes):
            return clean(value.decode("utf-8", "replace"), 4000)
        if isinstance(value, str):
            return clean(value, 4000)
        if isinstance(value, dict):
            return {clean(str(k), 200): convert(v, depth + 1) for k, v in list(value.items())[:200]}
        if isinstance(value, list | tuple):
            return [convert(v, depth + 1) for v in list(value)[:200]]
        if isinstance(value, datetime):
            return value.isoformat()
        if isinstance(value, bool) or value is None:
            return value
        if isinstance(value, int) and -(2**53) < value < 2**53:
            return value
        return clean(str(value), 200)

    return json.dumps(convert(headers, 0))


@dataclass(frozen=True)
class Letter:
    """One dead message as stored: where it was going, why it died, what it was."""

    message_id: str
    message_type: str | None
    order_id: str | None
    saga_id: str | None
    queue: str | None
    exchange: str
    routing_key: str
    reason: str
    error: str | None
    attempts: int
    first_at: datetime
    last_at: datetime
    headers: dict[str, Any]
    body: bytes
    sender: str | None = None
    transport_id: str | None = None
    # Whether it holds its order, and under which message id the order's block is kept.
    blocks: bool = True
    block_key: str | None = None


async def record_death(tx: Tx, letter: Letter) -> int:
    """Store a dead letter, or return a replayed one to its row (its history kept), and block
    its order when the letter is one that may. The same delivery seen twice (the ingester died
    before its ack) finds its row and changes nothing."""
    info = (letter.reason, clean(letter.error or "", 4000) or None, letter.attempts,
            letter.first_at, letter.last_at, jsonable_headers(letter.headers))  # fmt: skip
    replay_of = header_text(letter.headers.get(REPLAY_HEADER))
    replayed = int(replay_of) if replay_of and replay_of.isdigit() and len(replay_of) < 18 else None
    dl_id = None
    if replayed is not None:
        dl_id = await tx.conn.fetchval(Q.dl_dead_again, replayed, letter.message_id, *info)
    if dl_id is None:
        dl_id = await tx.conn.fetchval(
            Q.dl_insert, letter.message_id, letter.message_type, letter.order_id,
            letter.saga_id, letter.queue, letter.exchange, letter.routing_key, *info,
            letter.body, letter.sender, letter.transport_id, letter.blocks, letter.block_key,
        )  # fmt: skip
    if letter.blocks and letter.order_id:
        reason = f"dead-lettered ({letter.reason}): {letter.error or 'no error recorded'}"
        key = letter.block_key or letter.message_id
        arrival = await tx.block(letter.order_id, key, "dead", reason)
        await tx.conn.execute(Q.dl_set_arrival, dl_id, arrival)
    return int(dl_id)


async def bury_unroutable(tx: Tx, row: Any, error: BaseException) -> None:
    """An outbox row the broker cannot route (its exchange is gone, no queue is bound) becomes
    a dead letter instead of wedging the relay: it is kept, its order blocked, for an operator."""
    now = datetime.now(UTC)
    await record_death(
        tx,
        Letter(
            message_id=row["message_id"], message_type=row["message_type"],
            order_id=row["order_id"] or None, saga_id=None, queue=None,
            exchange=row["exchange"], routing_key=row["routing_key"], reason="unroutable",
            error=f"{type(error).__name__}: {error}", attempts=1, first_at=now, last_at=now,
            headers=json.loads(row["headers"]), body=row["body"],
        ),
    )  # fmt: skip


# Lifts an order's block by a message and applies what waits behind it (``Processor.release``).
Release = Callable[[Tx, str, str, datetime], Awaitable[object]]


@dataclass(frozen=True)
class Judgement:
    """What the ingester makes of a dead letter."""

    reason: str  # delivery_limit, forged, invalid, ...: the one shown to operators
    blocks: bool
    order_id: str | None
    block_key: str | None = None
    detail: str | None = None


async def applied_elsewhere(
    tx: Tx, judged: Judgement, release: Release | None, now: datetime
) -> bool:
    """Whether another copy of a dead message was applied (a publisher sent it twice, one copy
    went through, the other used up its deliveries): then its death holds nothing, and
    blocking its order would stop it for an operator's replay that can only be absorbed; a
    block its failures left is lifted (``release``: the processor's, which applies what waits
    behind it). The order's lock comes first: a copy applied meanwhile either committed
    before (its inbox row is seen here) or waits for this commit, then finds the block and
    lifts it."""
    if not (judged.blocks and judged.order_id and judged.block_key):
        return False
    await tx.lock_order(judged.order_id)
    if not await tx.applied(judged.block_key):
        return False
    if release is not None:
        await release(tx, judged.order_id, judged.block_key, now)
    return True


class DeadLetterIngester:
    def __init__(
        self, settings: Settings, bus: Bus, store: Store, release: Release | None = None
    ) -> None:
        self.settings = settings
        self.bus = bus
        self.store = store
        self.release = release
        self.directory = Directory.from_settings(settings)
        for reason in metrics.DEAD_LETTER_REASONS:
            metrics.DEAD_LETTERS.labels(reason)  # each series at 0 before its first letter

    async def handle(self, delivery: AbstractIncomingMessage) -> None:
        headers = dict(delivery.headers or {})
        # The broker's count of this queue's deliveries; on a first delivery the header may
        # still be whatever the original publisher put there, so only a redelivery's counts.
        deliveries = headers.get("x-delivery-count") if delivery.redelivered else 0
        if isinstance(deliveries, int) and deliveries >= self.settings.delivery_limit:
            await self._last_resort(delivery, f"not stored after {deliveries} deliveries")
            return
        try:
            dl_id, letter = await self.store.run(lambda tx: self._ingest(tx, delivery))
        except RetryLater:
            raise  # the database is away: held and retried, like every consumer's message
        except Exception as exc:  # stored as bare bytes, or requeued and bounded above
            log.exception("dead letter %s could not be stored", delivery.message_id)
            error = exc
            await self.store.run(lambda tx: self._unstorable(tx, delivery, error))
            return
        metrics.DEAD_LETTERS.labels(letter.reason).inc()
        # The one place a failure's traceback is logged (the consumer that gave up kept it):
        # the error in the line, the traceback in its own key (logs.TRACEBACK).
        said, _, trace = (letter.error or "no error recorded").partition("\n")
        context = logs.context(message_id=letter.message_id, order_id=letter.order_id,
                               saga_id=letter.saga_id, queue=letter.queue)  # fmt: skip
        log.warning("dead letter %s: %s %s (%s): %s", dl_id, letter.message_type,
                    letter.message_id, letter.reason, said,
                    extra={**context, logs.TRACEBACK: trace})  # fmt: skip

    async def _ingest(self, tx: Tx, delivery: AbstractIncomingMessage) -> tuple[int, Letter]:
        headers = dict(delivery.headers or {})
        ident = identify_incoming(delivery)
        death = read_death(headers, datetime.now(UTC))
        # the consumer that gave up recorded why; the broker only says how it ended
        failure = await tx.conn.fetchrow(Q.failure_get, ident.message_id, death.queue or "")
        sender = self.sender_of(delivery, death)
        judged = await self.judge(tx, delivery, ident, death, sender)
        # what the consumer said when it gave up, else what the ingester found
        error = failure["last_error"] if failure else judged.detail
        if await applied_elsewhere(tx, judged, self.release, death.at):
            judged = replace(judged, blocks=False)
            error = f"{error or judged.reason}; another copy of it was applied: it holds nothing"
        letter = Letter(
            message_id=ident.message_id, message_type=ident.message_type,
            order_id=judged.order_id, saga_id=ident.saga_id, queue=death.queue,
            exchange=death.exchange, routing_key=death.routing_key, reason=judged.reason,
            error=error,
            attempts=failure["attempts"] if failure else death.count,
            first_at=failure["first_at"] if failure else death.at, last_at=death.at,
            headers=headers, body=delivery.body, sender=sender,
            transport_id=ident.transport_id, blocks=judged.blocks, block_key=judged.block_key,
        )  # fmt: skip
        dl_id = await record_death(tx, letter)
        if judged.reason == "forged":
            what = f"{letter.message_type or 'a message'} on {death.queue}: {judged.detail}"
            self._alert(tx, "alert.forged", what, dl_id, sender, judged.order_id)
        return dl_id, letter

    def sender_of(self, delivery: AbstractIncomingMessage, death: Death) -> str | None:
        """Who sent the letter's message: the broker's verified user, or, for a letter that the
        consumer of a request queue buried itself, the sender it names, believed only from the
        service whose queue it is (anyone else's copy is judged as theirs); for an outcome a
        coordinator moved to a partition's quorum queue, the sender it names
        (``trust.first_sender``)."""
        publisher = header_text(delivery.user_id, 128)
        ours = (delivery.headers or {}).get(DEAD_HEADER)
        kind, service = self.bus.topology.kind_of(death.queue)
        if (isinstance(ours, dict) and kind == "action"
                and self.directory.owns(publisher, f"{service}.")):  # fmt: skip
            return header_text(ours.get("sender"), 128)
        if kind == "partition":  # moved there from the outcome queue by a coordinator
            return trust.first_sender(self.directory, publisher, delivery.headers)
        return publisher

    async def judge(
        self,
        tx: Tx,
        delivery: AbstractIncomingMessage,
        ident: Identity,
        death: Death,
        sender: str | None,
    ) -> Judgement:
        """Decode and check the letter as the consumer of its queue did. A valid letter from its
        rightful sender blocks its order (named by the validated body, never a header)."""
        kind, which = self.bus.topology.kind_of(death.queue)
        if kind == "other":
            return Judgement(death.reason, False, ident.order_id)
        replay = (delivery.headers or {}).get(REPLAY_HEADER)
        if replay is not None and self.directory.is_coordinator(sender):
            _, sender = await tx.replayed_sender(replay, ident.message_id, dead_too=True)
        limit = self.settings.max_message_bytes
        try:
            if kind == "intake" or death.exchange == self.bus.topology.commands_exchange:
                command = decode_incoming(delivery, COMMANDS, limit)
                check_order_header(delivery, getattr(command, "order_id", None))
                trust.command_sender(self.directory, sender)
                if isinstance(command, QuerySaga | DeskCommand):  # asks, changes no order
                    return Judgement(death.reason, False, getattr(command, "order_id", None))
                key = trust.forwarded_id(sender or "", command.message_id)
                return Judgement(death.reason, True, command.order_id, key)
            if kind == "partition":
                message = decode_incoming(delivery, PARTITION, limit)
                check_order_header(delivery, message.order_id)
                trust.partition_message(self.directory, message, sender)
                if partition_of(message.order_id, self.settings.partitions) != which:
                    raise InvalidMessage(f"order {message.order_id} is not routed to {death.queue}")
                return Judgement(death.reason, True, message.order_id, message.message_id)
            request = decode_incoming(delivery, _REQUEST, limit)
            trust.request(self.directory, request, sender, str(which))
            return Judgement(death.reason, True, request.order_id, request.message_id)
        except trust.Forged as exc:
            return Judgement("forged", False, ident.order_id, detail=exc.reason)
        except InvalidMessage as exc:
            return Judgement("invalid", False, ident.order_id, detail=exc.reason)

    def _alert(
        self, tx: Tx, kind: str, detail: str, dl_id: int | None, sender: str | None,
        order_id: str | None,
    ) -> None:  # fmt: skip
        alert = Alert.model_validate({"type": kind, "detail": clean(detail, 4000),
                                      "dead_letter_id": dl_id, "sender": sender,
                                      "order_id": order_id})  # fmt: skip
        topology = self.bus.topology
        tx.outbox([OutboxRow.of(topology.events_exchange, alert.type, alert)])

    async def _unstorable(self, tx: Tx, delivery: AbstractIncomingMessage, error: Exception) -> int:
        """The last row that can always be written: the bytes, the ids that are well formed,
        and what went wrong. The letter blocks nothing; the alert says it needs a look."""
        ident = identify_incoming(delivery)
        now = datetime.now(UTC)
        letter = Letter(
            message_id=ident.message_id, message_type=ident.message_type, order_id=None,
            saga_id=None, queue=None, exchange="", routing_key="", reason="unstorable",
            error=clean(f"{type(error).__name__}: {error}", 2000), attempts=1,
            first_at=now, last_at=now, headers={}, body=delivery.body,
            sender=header_text(delivery.user_id, 128), transport_id=ident.transport_id,
            blocks=False,
        )  # fmt: skip
        letter = replace(letter, message_id=f"{ident.message_id}:unstorable")
        dl_id = await record_death(tx, letter)
        self._alert(tx, "alert.unstorable", letter.error or "", dl_id, letter.sender, None)
        return dl_id

    async def _last_resort(self, delivery: AbstractIncomingMessage, why: str) -> None:
        """Out of the dead-letter queue into one nobody consumes, with its bytes and headers
        intact; confirmed before the ack, so it is moved, never lost."""
        message = aio_pika.Message(
            delivery.body,
            headers={**dict(delivery.headers or {}), "x-last-resort": why},
            message_id=delivery.message_id,
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        )
        await self.bus.publish_raw("", self.bus.topology.last_resort_queue, message, mandatory=True)
        log.error("dead letter %s moved to %s: %s", delivery.message_id,
                  self.bus.topology.last_resort_queue, why)  # fmt: skip

    async def run(self) -> None:
        await self.bus.consume(
            self.bus.topology.dead_letter_queue, self.handle, prefetch=16, mode="sequential"
        )
