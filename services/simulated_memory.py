"""The simulated systems in memory: a twin of their Postgres side for the test kit and the
deterministic whole-system simulation, held to the same contract as the SQL by
``tests/integration/test_simulated_contract.py``.

``MemorySystems`` holds what the four systems' tables, ``sim_effects`` and ``sim_faults`` hold;
``MemorySimulated`` is the ``Simulated`` their functions call, running ``sim_call`` (migration
0012) statement for statement against it, with a ``MemoryKeys`` as the key record: the same
row the adapter SDK claims, as ``service_keys`` is for Postgres. Time comes from an injected
clock, ids from the callers' values; nothing here is random.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import asyncpg

from saga_services.errors import Permanent, Transient
from saga_services.faults import check_action, parse_mode
from saga_services.keys import MemoryKeys, _Row
from saga_services.simulated import Simulated, _Hung, _Write
from saga_services.simulated_tables import BadValue, Clock, Fault, Raised, Result, Tables
from saga_services.simulated_tables import jsonb as _jsonb
from saga_services.simulated_tables import quote_literal as _quote
from saga_services.store import Conn, plain

Rows = list[dict[str, object]]


class MemorySystems(Tables):
    """The four systems' tables, the effects log and the faults, in memory. ``keys``: the key
    record the calls store their outcomes in when their ``MemorySimulated`` is given none."""

    def __init__(self, clock: Clock | None = None, keys: MemoryKeys | None = None) -> None:
        super().__init__(clock or (lambda: datetime.now(UTC)))
        self.keys = keys or MemoryKeys(self.clock, atomic=True)

    # --- faults (saga_services.faults over sim_faults) --------------------------------------------

    def add_fault(self, action: str, order_id: str, mode: str) -> None:
        """Inject a fault, replacing any fault already set on this action and order."""
        check_action(action)
        if not order_id:
            raise ValueError("order_id must not be empty")
        kind, remaining = parse_mode(mode)
        self.faults[(action, order_id)] = Fault(action, order_id, kind, remaining, self.clock())

    def list_faults(self) -> Rows:
        return [
            _plain(action=f.action, order_id=f.order_id, mode=f.mode, remaining=f.remaining,
                   created_at=f.created_at)
            for f in sorted(self.faults.values(), key=lambda f: (f.order_id, f.action))
        ]  # fmt: skip

    def clear_faults(self, order_id: str | None = None) -> int:
        """Remove the faults of one order, or every fault when ``order_id`` is None."""
        gone = [k for k, f in self.faults.items() if order_id is None or f.order_id == order_id]
        for k in gone:
            del self.faults[k]
        return len(gone)

    # --- what an operator sees (saga_services.effects over queries.sql) ---------------------------

    def effects_for_order(self, order_id: str) -> dict[str, Rows]:
        """The shape of ``saga_services.effects.effects_for_order``: each system's rows of the order
        (as its query orders them) and the effects applied per key."""
        mine = order_id.__eq__
        reservations = sorted((r for r in self.reservations.values() if mine(r.order_id)),
                              key=lambda r: (r.created_at, r.reservation_id))  # fmt: skip
        notes = sorted((n for n in self.credit_notes.values() if mine(n.order_id)),
                       key=lambda n: (n.created_at, n.credit_note_id))  # fmt: skip
        charges = sorted((c for c in self.charges.values() if mine(c.order_id)),
                         key=lambda c: (c.created_at, c.payment_id))  # fmt: skip
        emails = sorted((e for e in self.emails.values() if mine(e.order_id)),
                        key=lambda e: (e.sent_at, e.email_id))  # fmt: skip
        return {
            "reservations": [
                _plain(reservation_id=r.reservation_id, sku=r.sku, quantity=r.quantity,
                       status=r.status, created_at=r.created_at, released_at=r.released_at)
                for r in reservations
            ],
            "credit_notes": [
                _plain(credit_note_id=n.credit_note_id, amount_cents=n.amount_cents,
                       status=n.status, created_at=n.created_at, voided_at=n.voided_at)
                for n in notes
            ],
            "charges": [
                _plain(payment_id=c.payment_id, amount_cents=c.amount_cents,
                       card_token=c.card_token, status=c.status, refund_id=c.refund_id,
                       created_at=c.created_at, refunded_at=c.refunded_at)
                for c in charges
            ],
            "emails": [
                _plain(email_id=e.email_id, recipient=e.recipient, template=e.template,
                       sent_at=e.sent_at)
                for e in emails
            ],
            "applied": self._applied(order_id),
        }  # fmt: skip

    def _applied(self, order_id: str) -> Rows:
        # GROUP BY action, idempotency_key ORDER BY min(id): the log is in id order already.
        groups: dict[tuple[str, str], list[Any]] = {}
        for e in self.effects:
            if e.order_id == order_id:
                groups.setdefault((e.action, e.idempotency_key), []).append(e)
        return [
            _plain(action=action, idempotency_key=key,
                   entity_id=", ".join(sorted({e.entity_id for e in rows})), times=len(rows),
                   first_applied_at=min(e.applied_at for e in rows))
            for (action, key), rows in groups.items()
        ]  # fmt: skip

    # --- sim_call --------------------------------------------------------------------------------

    def sim_call(self, keys: MemoryKeys, system: str, w: _Write) -> Answer:
        """``sim_call`` (migration 0012) on the statement running: answer from a final stored
        outcome, else apply an injected fault, else run the action; store the outcome."""
        v = _parameters(w)
        stored = keys.rows.get(w.key)
        if stored is None:  # a call the adapter SDK did not claim first (the tests' calls)
            stored = _Row(w.action, w.order_id, "pending")
            self.journal.added(keys.rows, w.key)
            keys.rows[w.key] = stored
        # Stripe refuses a key reused with other parameters; another action or order is the
        # same mistake, and returning the other call's result would hide it.
        if (stored.action, stored.order_id) != (w.action, w.order_id):
            return Answer("failed", None, f"idempotency key {_quote(w.key)} was first used for "
                          f"{stored.action} on order {stored.order_id}")  # fmt: skip
        if stored.outcome == "done":
            return Answer("done", stored.result if stored.result is not None else {}, None)
        if stored.outcome != "pending":
            return Answer("failed", None, stored.outcome if stored.error is None else stored.error)
        reason = w.refusal
        fault = self.faults.get((w.action, w.order_id))
        if fault is not None and fault.mode == "permanent":
            reason = f"injected permanent fault on {w.action}"
        elif fault is not None and (hung := self._consume(fault)) is not None:
            return hung  # nothing lands; the claim stays unfinished, so a settle may fence it
        answer: Result | None = None
        if reason is None:
            answer, reason = self._run(keys, system, w, v)
        self.journal.changing(stored)
        stored.outcome = "failed" if answer is None else "done"
        stored.result, stored.error = answer, reason
        return Answer(stored.outcome, answer, reason)

    def _consume(self, fault: Fault) -> Answer | None:
        """A transient or hang fault: one of its calls used up (None: it is spent)."""
        was = fault.remaining
        left = None
        if was is not None and was > 0:
            self.journal.changing(fault)
            fault.remaining = left = was - 1
        if left is None and not (fault.mode == "hang" and was is None):
            return None
        if fault.mode == "hang":
            return Answer("hang", None, f"injected hang on {fault.action}", transient=True)
        return Answer(None, None, f"injected transient fault on {fault.action} ({left} more to "
                      "come)", transient=True)  # fmt: skip

    def _run(
        self, keys: MemoryKeys, system: str, w: _Write, v: Result
    ) -> tuple[Result | None, str | None]:
        # A subtransaction in the SQL: an action refusing half-way leaves none of its writes,
        # while the claim survives to store the refusal.
        mark = self.journal.mark()
        try:
            return self.sim_apply(keys, w.action, w.order_id, w.key, v), None
        except Raised as exc:
            self.journal.rollback(mark)
            return None, str(exc)
        except BadValue as exc:
            self.journal.rollback(mark)
            return None, f"{system} refused a value: {str(exc)[:500]}"

    def statement(self, keys: MemoryKeys, system: str, writes: list[_Write]) -> list[Answer]:
        """One statement (``call`` or ``call_many``): one time for all, and all or nothing."""
        self.now = self.clock()
        self.journal.clear()
        try:
            answers = [self.sim_call(keys, system, w) for w in writes]
        except BaseException:
            self.journal.rollback()
            raise
        self.journal.clear()
        return answers


@dataclass(frozen=True)
class Answer:
    """A row of ``sim_call``: call_outcome, call_result, call_error, call_transient."""

    outcome: str | None
    result: Result | None
    error: str | None
    transient: bool = False


class MemorySimulated(Simulated):
    """``Simulated`` over ``MemorySystems``: the same ``apply`` / ``refuse`` (and batching of a
    delivery's calls into one statement, and a hang that never answers), with ``sim_call`` run
    in memory. ``keys``: the adapter's key record (by default ``systems.keys``)."""

    def __init__(self, system: str, systems: MemorySystems, keys: MemoryKeys | None = None) -> None:
        if keys is not None and not isinstance(keys, MemoryKeys):
            # The outcome must land in the very row the adapter claimed, as in Postgres.
            raise TypeError(f"the in-memory {system} keeps its outcomes in a MemoryKeys, not in "
                            f"{type(keys).__name__}")  # fmt: skip
        super().__init__(system, _no_database)
        self.systems = systems
        self.keys = keys or systems.keys

    async def _run_many(self, writes: list[_Write]) -> list[Result | Exception]:
        # Key order, as call_many runs them (that is the order effects get their ids in).
        order = sorted(range(len(writes)), key=lambda i: writes[i].key)
        answers = self.systems.statement(self.keys, self.system, [writes[i] for i in order])
        out = {i: _verdict(answer) for i, answer in zip(order, answers, strict=True)}
        return [out[i] for i in range(len(writes))]


def _verdict(answer: Answer) -> Result | Exception:
    """``saga_services.simulated._verdict`` on a row of the twin."""
    if answer.outcome == "hang":
        return _Hung(answer.error)
    if answer.transient:
        return Transient(answer.error or "")
    if answer.outcome == "done":
        copied = _jsonb(answer.result)  # a fresh copy, as each read of the row is
        return copied if isinstance(copied, dict) else {}
    return Permanent(answer.error or "failed")


def _parameters(w: _Write) -> Result:
    """What Postgres refuses of the statement's parameters before running anything: a NUL in
    a text, or values the ``::jsonb`` cast does not take (then the values, as jsonb)."""
    if any("\x00" in p for p in (w.key, w.action, w.order_id, w.refusal or "")):
        raise asyncpg.CharacterNotInRepertoireError(
            'invalid byte sequence for encoding "UTF8": 0x00'
        )
    v = _jsonb(w.values)
    return v if isinstance(v, dict) else {}


@contextlib.asynccontextmanager
async def _no_database() -> AsyncIterator[Conn]:
    raise RuntimeError("the in-memory simulated systems have no database connection")
    yield  # an async generator, as asynccontextmanager wants


def _plain(**columns: object) -> dict[str, object]:
    return {name: plain(value) for name, value in columns.items()}
