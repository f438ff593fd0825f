"""The in-memory twin of the store: the same ``Transaction`` as ``store.Tx``, over dicts.

For the test kit and for unit tests only: one process, one task at a time, nothing durable.
``MemoryStore.run`` works on a copy of the state and keeps it only when ``work`` returns, so a
transaction is all or nothing as in Postgres. ``tests/integration/test_store_contract.py`` runs
one suite against both this and Postgres, so the two cannot drift apart.
"""

from __future__ import annotations

import copy
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple, TypeVar

from saga_coordinator.convoy import Block, OrderView
from saga_coordinator.ports import Transaction
from saga_coordinator.register import SagaState
from saga_coordinator.rows import Claim, OutboxRow, Parked
from saga_coordinator.transition import Event
from saga_coordinator.writes import count_events
from shared.messages import DeadlineReached, Envelope

T = TypeVar("T")


@dataclass(frozen=True)
class Armed:
    order_id: str
    step: int
    phase: str
    key: str
    attempt: int
    due_at: datetime


class SagaRow(NamedTuple):
    arrival: int
    order_id: str
    status: str
    state: str


@dataclass
class MemoryState:
    inbox: set[str] = field(default_factory=set)
    orders: dict[str, tuple[str | None, int, int]] = field(default_factory=dict)
    # order -> message id -> (state, reason, arrival)
    blocks: dict[str, dict[str, tuple[str, str, int]]] = field(default_factory=dict)
    parked: dict[int, tuple[str, Parked]] = field(default_factory=dict)
    # saga id -> its row: the register kept as JSON text, like the jsonb column, so that a
    # caller's copy never aliases the stored one
    sagas: dict[str, SagaRow] = field(default_factory=dict)
    deadlines: dict[str, Armed] = field(default_factory=dict)
    outbox: list[tuple[int, OutboxRow]] = field(default_factory=list)
    log: list[tuple[str, str, str, str, str, int | None]] = field(default_factory=list)
    refusals: list[tuple[str, str, str, str, str]] = field(default_factory=list)
    counter: int = 0  # the sequences (arrival numbers, ids), one for all: only growth matters

    def next(self) -> int:
        self.counter += 1
        return self.counter


class MemoryTx:
    def __init__(self, state: MemoryState) -> None:
        self.s = state
        self.sent: list[tuple[int, OutboxRow]] = []
        self.events: list[Event] = []  # counted by the store once the work returns

    def _view(self, order_id: str) -> OrderView:
        active, next_seq, handled = self.s.orders.setdefault(order_id, (None, 1, 0))
        blocks = sorted(self.s.blocks.get(order_id, {}).items(), key=lambda kv: kv[1][2])
        return OrderView(
            order_id, active, next_seq, handled,
            tuple(Block(message_id, state) for message_id, (state, _, _) in blocks),
            any(o == order_id for o, _ in self.s.parked.values()),
            bool(self._waiting(order_id)),
        )  # fmt: skip

    def _waiting(self, order_id: str) -> list[tuple[int, str]]:
        """(arrival, saga id) of the order's waiting sagas."""
        rows = self.s.sagas.items()
        return [
            (r.arrival, sid) for sid, r in rows if r.order_id == order_id and r.status == "waiting"
        ]

    def _saga(self, saga_id: str) -> SagaState | None:
        found = self.s.sagas.get(saga_id)
        return None if found is None else SagaState.model_validate_json(found.state)

    def _put(self, state: SagaState) -> None:
        known = self.s.sagas.get(state.saga_id)
        arrival = known.arrival if known is not None else self.s.next()
        self.s.sagas[state.saga_id] = SagaRow(
            arrival, state.order_id, state.status, state.model_dump_json()
        )

    async def claim(self, messages: Sequence[Envelope]) -> list[Claim]:
        claims = []
        for m in messages:
            fresh = m.message_id not in self.s.inbox
            self.s.inbox.add(m.message_id)
            claims.append(Claim(fresh, self._view(m.order_id), self._saga(m.saga_id)))
        return claims

    async def lock_order(self, order_id: str) -> OrderView:
        return self._view(order_id)

    def save_order(self, order: OrderView) -> None:
        self.s.orders[order.order_id] = (order.active_saga_id, order.next_seq, order.handled)

    async def block(self, order_id: str, message_id: str, state: str, reason: str) -> int:
        blocks = self.s.blocks.setdefault(order_id, {})
        arrival = blocks[message_id][2] if message_id in blocks else self.s.next()
        blocks[message_id] = (state, reason, arrival)
        return arrival

    async def unblock(self, order_id: str, message_id: str) -> int | None:
        found = self.s.blocks.get(order_id, {}).pop(message_id, None)
        return None if found is None else found[2]

    async def park(
        self, message: Envelope, seq: int | None, reason: str, arrival: int | None = None
    ) -> None:
        if any(p.message_id == message.message_id for _, p in self.s.parked.values()):
            return
        ident = self.s.next()
        body = message.model_dump_json().encode()
        place = arrival if arrival is not None else self.s.next()
        kept = Parked(ident, message.message_id, message.type, seq, reason, body, place)
        self.s.parked[ident] = (message.order_id, kept)

    async def parked(self, order_id: str) -> list[Parked]:
        mine = [p for o, p in self.s.parked.values() if o == order_id]
        return sorted(mine, key=lambda p: (p.arrival, p.id))

    async def unpark(self, parked_id: int) -> None:
        self.s.parked.pop(parked_id, None)

    async def replayed_sender(
        self, header: object, message_id: str, *, dead_too: bool = False
    ) -> tuple[bool, str | None]:
        return False, None  # no broker, so no dead letters to replay

    def refusal(self, message: Envelope, rule: str, reason: str, sender: str | None) -> None:
        self.s.refusals.append((message.message_id, message.saga_id, rule, reason, sender or ""))

    async def lock_saga(self, saga_id: str) -> SagaState | None:
        return self._saga(saga_id)

    async def next_waiting(self, order_id: str) -> SagaState | None:
        waiting = self._waiting(order_id)
        return self._saga(min(waiting)[1]) if waiting else None

    async def waiting_for(self, order_id: str, saga_id: str) -> None:
        for _, waiting in self._waiting(order_id):
            state = self._saga(waiting)
            assert state is not None
            self._put(state.evolve(waiting_for=saga_id))

    def save_saga(self, state: SagaState, *, now: datetime) -> None:
        self._put(state)

    def log(self, message: Envelope, saga_id: str, note: str, seq: int | None) -> None:
        self.s.log.append((saga_id, message.order_id, message.message_id, message.type, note, seq))

    def arm_deadline(
        self, state: SagaState, step: int, phase: str, key: str, attempt: int, due_at: datetime
    ) -> None:
        self.s.deadlines[state.saga_id] = Armed(state.order_id, step, phase, key, attempt, due_at)

    def disarm_deadline(self, saga_id: str) -> None:
        self.s.deadlines.pop(saga_id, None)

    def count(self, events: Sequence[Event]) -> None:
        self.events.extend(events)

    def outbox(self, rows: Sequence[OutboxRow]) -> None:
        for row in rows:
            written = (self.s.next(), row)
            self.s.outbox.append(written)
            self.sent.append(written)

    async def flush(self) -> None:
        return None  # nothing is buffered


class MemoryStore:
    """The state, and ``run`` to work on it in a transaction."""

    def __init__(self) -> None:
        self.state = MemoryState()

    async def run(self, work: Callable[[MemoryTx], Awaitable[T]]) -> T:
        result, _ = await self.run_publishing(work)
        return result

    async def run_publishing(
        self, work: Callable[[MemoryTx], Awaitable[T]]
    ) -> tuple[T, list[tuple[int, OutboxRow]]]:
        """``work`` on a copy; the copy becomes the state only if it returns."""
        tx = MemoryTx(copy.deepcopy(self.state))
        result = await work(tx)
        self.state = tx.s
        count_events(tx.events)
        return result, tx.sent

    def take_outbox(self) -> list[OutboxRow]:
        """The committed outbox rows, in order, removed (as the relay would publish them)."""
        rows, self.state.outbox = self.state.outbox, []
        return [row for _, row in rows]

    def get(self, saga_id: str) -> SagaState | None:
        return MemoryTx(self.state)._saga(saga_id)

    def sagas(self) -> list[SagaState]:
        return [SagaState.model_validate_json(r.state) for r in self.state.sagas.values()]

    def history(self, saga_id: str) -> list[dict[str, Any]]:
        return [
            {"message_id": m, "message_type": t, "note": note, "seq": seq}
            for s, _, m, t, note, seq in self.state.log
            if s == saga_id
        ]

    def due(self, now: datetime) -> list[DeadlineReached]:
        """The deadlines due at ``now``, disarmed (as the timer fires them)."""
        armed = self.state.deadlines
        due = sorted((a.due_at, saga_id) for saga_id, a in armed.items() if a.due_at <= now)
        fired = []
        for _, saga_id in due:
            a = armed.pop(saga_id)
            fired.append(
                DeadlineReached.model_validate(
                    {
                        "saga_id": saga_id,
                        "order_id": a.order_id,
                        "step": a.step,
                        "phase": a.phase,
                        "idempotency_key": a.key,
                        "attempt": a.attempt,
                        "timestamp": now,
                    }
                )
            )
        return fired


def _is_a_transaction(tx: MemoryTx) -> Transaction:
    return tx  # mypy checks here that the twin has every method of the interface
