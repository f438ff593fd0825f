"""The tables of the four simulated systems in memory, and their actions: ``sim_apply``,
``sim_target``, ``sim_status`` and ``sim_effect`` of migrations 0007 and 0012, statement for
statement (``saga_services.simulated_memory`` runs them as ``sim_call`` does).

What Postgres does on the way is kept too, since the contract test holds both to the same
answers: ``v ->> 'field'`` reads any JSON scalar as text, ``::integer`` refuses what int4 refuses
(a ``data_exception``, which ``sim_call`` stores as a refusal), a NULL in a NOT NULL column or a
duplicate id fails the whole statement (asyncpg's own exception types, so callers cannot tell
the difference), and every write is journaled so that a failed statement, or an action refusing
half-way inside ``sim_call``'s subtransaction, leaves none of its writes.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import asyncpg
from pydantic import JsonValue

from saga_services.keys import MemoryKeys, _Row

Result = dict[str, JsonValue]
Clock = Callable[[], datetime]


@dataclass
class Reservation:
    reservation_id: str
    order_id: str
    sku: str
    quantity: int
    status: str  # reserved | released
    created_at: datetime
    released_at: datetime | None = None


@dataclass
class CreditNote:
    credit_note_id: str
    order_id: str
    amount_cents: int
    status: str  # issued | voided
    created_at: datetime
    voided_at: datetime | None = None


@dataclass
class Charge:
    payment_id: str
    order_id: str
    amount_cents: int
    card_token: str
    status: str  # charged | refunded
    created_at: datetime
    refund_id: str | None = None
    refunded_at: datetime | None = None


@dataclass
class Email:
    email_id: str
    order_id: str
    recipient: str
    template: str
    sent_at: datetime


@dataclass
class Effect:
    """A row of ``sim_effects``: one per effect applied, so "applied twice" is countable."""

    id: int
    system: str
    action: str
    order_id: str
    idempotency_key: str
    entity_id: str
    detail: Result
    applied_at: datetime

    def __getitem__(self, column: str) -> Any:
        # Read by column name too, as a record of sim_effects is (checks written for either).
        return getattr(self, column)


@dataclass
class Fault:
    action: str
    order_id: str
    mode: str  # permanent | transient | hang
    remaining: int | None
    created_at: datetime


class Raised(Exception):
    """A ``RAISE EXCEPTION`` of the SQL: ``sim_call`` stores its text as the refusal."""


class BadValue(Exception):
    """A ``data_exception``: ``sim_call`` stores "<system> refused a value: <text>"."""


class Journal:
    """Undo records of the statement running: Postgres keeps none of a failed statement's writes
    (nor of a subtransaction rolled back), so neither does the twin."""

    def __init__(self) -> None:
        self._undo: list[Callable[[], None]] = []

    def mark(self) -> int:
        return len(self._undo)

    def rollback(self, mark: int = 0) -> None:
        while len(self._undo) > mark:
            self._undo.pop()()

    def clear(self) -> None:
        self._undo.clear()

    def added(self, table: dict[Any, Any], key: object) -> None:
        self._undo.append(lambda: table.pop(key, None))

    def appended(self, rows: list[Any]) -> None:
        size = len(rows)
        self._undo.append(lambda: rows.__delitem__(slice(size, None)))

    def changing(self, row: object) -> None:
        saved = dict(vars(row))
        self._undo.append(lambda: vars(row).update(saved))


class Tables:
    """The systems' rows; ``now`` is the running statement's time (Postgres's ``now()``)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.now = datetime.fromtimestamp(0, UTC)  # set by each statement
        self.journal = Journal()
        self.reservations: dict[str, Reservation] = {}
        self.credit_notes: dict[str, CreditNote] = {}
        self.charges: dict[str, Charge] = {}
        self.emails: dict[str, Email] = {}
        self.effects: list[Effect] = []
        self.faults: dict[tuple[str, str], Fault] = {}
        self._effect_ids = 0  # bigserial: a failed statement does not give its numbers back

    def sim_apply(self, keys: MemoryKeys, action: str, order: str, key: str, v: Result) -> Result:
        """``sim_apply``: the action on values the Python side checked; its result."""
        run = _ACTIONS.get(action)
        if run is None:
            raise Raised(f"{action} has no SQL in sim_apply")
        return run(self, keys, action, order, key, v)

    def sim_effect(self, action: str, order: str, key: str, entity: str, detail: Result) -> None:
        """``sim_effect``."""
        self._effect_ids += 1
        self.journal.appended(self.effects)
        self.effects.append(Effect(self._effect_ids, action.split(".")[0], action, order, key,
                                   entity, detail, self.now))  # fmt: skip

    def insert(self, table: dict[str, Any], relation: str, columns: dict[str, object]) -> None:
        """An INSERT of one row: NOT NULL in column order, then the primary key (the first
        column), as Postgres checks them."""
        for column, value in columns.items():
            if value is None:
                raise asyncpg.NotNullViolationError(
                    f'null value in column "{column}" of relation "{relation}" violates not-null '
                    "constraint"
                )
        entity = str(next(iter(columns.values())))
        if entity in table:
            raise asyncpg.UniqueViolationError(
                f'duplicate key value violates unique constraint "{relation}_pkey"'
            )
        self.journal.added(table, entity)
        table[entity] = _ROW_TYPES[relation](**columns, **_stamp(relation, self.now))

    def sim_target(
        self, keys: MemoryKeys, action: str, order: str, key: str, v: Result, forward: str,
        id_field: str,
    ) -> str | None:  # fmt: skip
        """``sim_target`` (0012): the id given, or the one the forward key's stored result
        names; a forward key never claimed, or claimed and unfinished, is fenced."""
        given = text(v, id_field)
        if given is not None:
            return given
        forward_key = text(v, "forward_key")
        if forward_key is None:
            raise asyncpg.NotNullViolationError(
                'null value in column "key" of relation "service_keys" violates not-null constraint'
            )
        fence = f"not run: {action} ({key}) compensated it first"
        stored = keys.rows.get(forward_key)
        if stored is None:
            self.journal.added(keys.rows, forward_key)
            keys.rows[forward_key] = _Row(forward, order, "fenced", error=fence)
            return None
        if stored.outcome == "pending":
            # Checked before whose key it is, as the SQL does: any unfinished claim is fenced.
            self.journal.changing(stored)
            stored.outcome, stored.error = "fenced", fence
            return None
        if stored.outcome != "done":
            return None
        if (stored.action, stored.order_id) != (forward, order):
            raise Raised(
                f"{action}: forward_key {quote_literal(forward_key)} belongs to {stored.action} "
                f"on order {stored.order_id}, not {forward} on {order}"
            )
        found = stored.result.get(id_field) if isinstance(stored.result, dict) else None
        if not isinstance(found, str):
            raise Raised(f"{action}: the stored result of {quote_literal(forward_key)} has no "
                         f"{id_field}")  # fmt: skip
        return found


def sim_status(action: str, order: str, table: dict[str, Any], entity: str | None) -> str | None:
    """``sim_status``: the target's status, NULL when it does not exist; another order's entity
    is refused loudly."""
    if entity is None:
        return None
    row = table.get(entity)
    if row is not None and row.order_id != order:
        raise Raised(f"{action}: {entity} belongs to order {row.order_id}, not {order}")
    return None if row is None else str(row.status)


# --- the actions (the CASE of sim_apply) ---------------------------------------------------------


def _reserve(t: Tables, keys: MemoryKeys, action: str, order: str, key: str, v: Result) -> Result:
    entity = text(v, "reservation_id")
    t.insert(t.reservations, "sim_inventory_reservations", {
        "reservation_id": entity, "order_id": order, "sku": text(v, "sku"),
        "quantity": integer(text(v, "quantity")), "status": "reserved",
    })  # fmt: skip
    assert entity is not None  # the insert refused a NULL
    t.sim_effect(action, order, key, entity, {"sku": v.get("sku"), "quantity": v.get("quantity")})
    return {"reservation_id": entity}


def _release(t: Tables, keys: MemoryKeys, action: str, order: str, key: str, v: Result) -> Result:
    target = t.sim_target(keys, action, order, key, v, "inventory.reserve_stock", "reservation_id")
    found = sim_status(action, order, t.reservations, target)
    if target is None or found != "reserved":
        return {"released": False, "reservation_id": target}
    row = t.reservations[target]
    t.journal.changing(row)
    row.status, row.released_at = "released", t.now
    t.sim_effect(action, order, key, target, {})
    return {"released": True, "reservation_id": target}


def _create(t: Tables, keys: MemoryKeys, action: str, order: str, key: str, v: Result) -> Result:
    entity = text(v, "credit_note_id")
    t.insert(t.credit_notes, "sim_erp_credit_notes", {
        "credit_note_id": entity, "order_id": order,
        "amount_cents": integer(text(v, "amount_cents")), "status": "issued",
    })  # fmt: skip
    assert entity is not None
    t.sim_effect(action, order, key, entity, {"amount_cents": v.get("amount_cents")})
    return {"credit_note_id": entity}


def _void(t: Tables, keys: MemoryKeys, action: str, order: str, key: str, v: Result) -> Result:
    target = t.sim_target(keys, action, order, key, v, "erp.create_credit_note", "credit_note_id")
    found = sim_status(action, order, t.credit_notes, target)
    if target is None or found != "issued":
        return {"voided": False, "credit_note_id": target}
    row = t.credit_notes[target]
    t.journal.changing(row)
    row.status, row.voided_at = "voided", t.now
    t.sim_effect(action, order, key, target, {})
    return {"voided": True, "credit_note_id": target}


def _validate(t: Tables, keys: MemoryKeys, action: str, order: str, key: str, v: Result) -> Result:
    return v  # read-only: the Python side computed the answer


def _charge(t: Tables, keys: MemoryKeys, action: str, order: str, key: str, v: Result) -> Result:
    entity = text(v, "payment_id")
    t.insert(t.charges, "sim_payments_charges", {
        "payment_id": entity, "order_id": order,
        "amount_cents": integer(text(v, "amount_cents")), "card_token": text(v, "card_token"),
        "status": "charged",
    })  # fmt: skip
    assert entity is not None
    t.sim_effect(action, order, key, entity, {"amount_cents": v.get("amount_cents")})
    return {"payment_id": entity}


def _refund(t: Tables, keys: MemoryKeys, action: str, order: str, key: str, v: Result) -> Result:
    target = t.sim_target(keys, action, order, key, v, "payments.charge_card", "payment_id")
    found = sim_status(action, order, t.charges, target)
    if target is None or found != "charged":
        return {"refunded": False, "payment_id": target, "refund_id": None}
    row = t.charges[target]
    t.journal.changing(row)
    row.status, row.refund_id, row.refunded_at = "refunded", text(v, "refund_id"), t.now
    t.sim_effect(action, order, key, target, {"refund_id": v.get("refund_id")})
    return {"refunded": True, "payment_id": target, "refund_id": row.refund_id}


def _send(t: Tables, keys: MemoryKeys, action: str, order: str, key: str, v: Result) -> Result:
    entity = text(v, "email_id")
    t.insert(t.emails, "sim_email_messages", {
        "email_id": entity, "order_id": order, "recipient": text(v, "recipient"),
        "template": text(v, "template"),
    })  # fmt: skip
    assert entity is not None
    t.sim_effect(action, order, key, entity, {"template": v.get("template")})
    return {"email_id": entity}


_ACTIONS: dict[str, Callable[[Tables, MemoryKeys, str, str, str, Result], Result]] = {
    "inventory.reserve_stock": _reserve, "inventory.release_stock": _release,
    "erp.create_credit_note": _create, "erp.void_credit_note": _void,
    "erp.validate_address": _validate, "payments.charge_card": _charge,
    "payments.refund_charge": _refund, "email.send_customer_email": _send,
    "email.send_confirmation": _send,
}  # fmt: skip
_ROW_TYPES: dict[str, Callable[..., Any]] = {
    "sim_inventory_reservations": Reservation, "sim_erp_credit_notes": CreditNote,
    "sim_payments_charges": Charge, "sim_email_messages": Email,
}  # fmt: skip


def _stamp(relation: str, now: datetime) -> dict[str, datetime]:
    return {"sent_at" if relation == "sim_email_messages" else "created_at": now}


# --- Postgres's conversions ----------------------------------------------------------------------

_INT4 = re.compile(r"[ \t\n\r\f\v]*[+-]?[0-9]+[ \t\n\r\f\v]*")


def integer(value: str | None) -> int | None:
    """``text::integer`` as Postgres 15 reads it."""
    if value is None:
        return None
    if not _INT4.fullmatch(value):
        raise BadValue(f'invalid input syntax for type integer: "{value}"')
    n = int(value)
    if not -(2**31) <= n < 2**31:
        raise BadValue(f'value "{value}" is out of range for type integer')
    return n


def text(v: Result, field: str) -> str | None:
    """``v ->> field``: a string as it is, any other JSON value as jsonb prints it."""
    value = v.get(field)
    if value is None or isinstance(value, str):
        return value
    return jsonb_text(value)


def jsonb_text(value: JsonValue) -> str:
    """How jsonb prints a value: ", " and ": " between items, object keys shortest first."""
    if isinstance(value, dict):
        items = sorted(value.items(), key=lambda kv: (len(kv[0].encode()), kv[0].encode()))
        return "{" + ", ".join(f"{_string(k)}: {jsonb_text(x)}" for k, x in items) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(jsonb_text(x) for x in value) + "]"
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, float):
        number = Decimal(repr(value))
        return format(abs(number) if number.is_zero() else number, "f")
    return str(value)


def jsonb(value: JsonValue) -> JsonValue:
    """A value as it comes back from ``$5::jsonb``: numbers through numeric (1e20 is then an
    integer), a NUL or a non-finite number refused like the cast refuses them."""
    if isinstance(value, dict):
        return {_no_nul(k): jsonb(x) for k, x in value.items()}
    if isinstance(value, list):
        return [jsonb(x) for x in value]
    if isinstance(value, str):
        return _no_nul(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise asyncpg.InvalidTextRepresentationError("invalid input syntax for type json")
        parsed: JsonValue = json.loads(jsonb_text(value))
        return parsed
    return value


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise asyncpg.UntranslatableCharacterError("unsupported Unicode escape sequence")
    return value


def _string(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)


def quote_literal(value: str) -> str:
    """Postgres's ``quote_literal``: quotes and backslashes doubled, ``E''`` around a
    backslash."""
    quoted = "'" + value.replace("'", "''").replace("\\", "\\\\") + "'"
    return "E" + quoted if "\\" in value else quoted
