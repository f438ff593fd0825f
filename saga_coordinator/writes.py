"""The writes of one coordinator transaction, buffered until they go to Postgres as arrays in one
statement (``write_batch``, or ``apply_batch`` for a group decided on the cache): registers,
deadlines, outbox rows, log lines and orders. ``store.Tx`` and ``guarded.GuardedTx`` share it."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, NamedTuple

from saga_coordinator.convoy import OrderView
from saga_coordinator.register import SagaState
from saga_coordinator.rows import OutboxRow
from saga_coordinator.transition import Event
from saga_shared.model.messages import CommandReply, Envelope
from saga_shared.observability import metrics

FINISHED = frozenset({"saga.completed", "saga.compensated", "saga.resolved", "saga.needs_human"})


class Deadline(NamedTuple):
    order_id: str
    step: int
    phase: str
    key: str
    attempt: int
    due_at: datetime | None  # None disarms


def count_events(events: Sequence[Event]) -> None:
    """The saga counters, for the events of a committed transaction."""
    for event in events:
        if event.type == "saga.started":
            metrics.SAGAS_STARTED.labels(event.saga).inc()
        elif event.type in FINISHED:
            metrics.SAGAS_FINISHED.labels(event.saga, event.status).inc()


def order_row(order: OrderView) -> tuple[str, str | None, int, int]:
    """An order's columns as the statements write them."""
    return order.order_id, order.active_saga_id, order.next_seq, order.handled


def columns(rows: Sequence[Any], width: int) -> list[list[Any]]:
    """Rows to the column arrays ``unnest`` takes."""
    return [list(column) for column in zip(*rows, strict=True)] if rows else [[]] * width


class Writes:
    """What a transaction decided to write, in the order it decided it; the last write of a saga,
    a deadline or an order wins."""

    def __init__(self) -> None:
        self._sagas: dict[str, SagaState] = {}
        self._deadlines: dict[str, Deadline] = {}
        self._outbox: list[OutboxRow] = []
        self._log: list[tuple[str, str, str, str, str, int | None]] = []
        self._orders: dict[str, OrderView] = {}
        self._now: datetime | None = None
        self._events: list[Event] = []
        self._replies: dict[str, bytes] = {}
        self._after: list[Callable[[], None]] = []

    def count(self, events: Sequence[Event]) -> None:
        self._events.extend(events)

    def on_commit(self, done: Callable[[], None]) -> None:
        self._after.append(done)

    def counted(self) -> None:
        """The transaction committed: its events count (once, however often it was decided:
        a group decided on the cache and then under locks counts only what committed)."""
        events, self._events = self._events, []
        count_events(events)
        after, self._after = self._after, []
        for done in after:
            done()

    def save_saga(self, state: SagaState, *, now: datetime) -> None:
        self._sagas[state.saga_id] = state
        self._now = now

    def save_order(self, order: OrderView) -> None:
        self._orders[order.order_id] = order

    def log(self, message: Envelope, saga_id: str, note: str, seq: int | None) -> None:
        self._log.append((saga_id, message.order_id, message.message_id, message.type, note, seq))

    def arm_deadline(
        self, state: SagaState, step: int, phase: str, key: str, attempt: int, due_at: datetime
    ) -> None:
        self._deadlines[state.saga_id] = Deadline(state.order_id, step, phase, key, attempt, due_at)

    def disarm_deadline(self, saga_id: str) -> None:
        self._deadlines[saga_id] = Deadline("", 0, "", "", 0, None)

    def outbox(self, rows: Sequence[OutboxRow]) -> None:
        self._outbox.extend(rows)

    def remember_reply(self, message_id: str, reply: CommandReply) -> None:
        self._replies[message_id] = reply.model_dump_json().encode()

    @property
    def pending(self) -> bool:
        return bool(
            self._sagas or self._deadlines or self._outbox or self._log or self._orders
            or self._replies
        )  # fmt: skip

    def take_replies(self) -> list[list[Any]]:
        """Empty the replies to remember: their message ids and bodies, as two columns."""
        replies, self._replies = self._replies, {}
        return [list(replies), list(replies.values())]

    def take(self) -> tuple[list[SagaState], list[OutboxRow], list[OrderView], list[list[Any]]]:
        """Empty the buffer: the registers, outbox rows and orders to write, and the columns
        of the deadlines (7), the outbox rows (7) and the log lines (6), in that order."""
        sagas, out, orders = list(self._sagas.values()), self._outbox, list(self._orders.values())
        deadlines, log_rows = self._deadlines, self._log
        self._sagas, self._deadlines, self._outbox, self._log, self._orders = {}, {}, [], [], {}
        rest = [
            list(deadlines), *columns(list(deadlines.values()), 6),
            *columns([(r.exchange, r.routing_key, r.message_id, r.message_type, r.order_id,
                       r.body, json.dumps(r.headers)) for r in out], 7),
            *columns(log_rows, 6),
        ]  # fmt: skip
        return sagas, out, orders, rest
