"""Simulated ERP: credit notes (and voiding them) and a read-only address check."""

from __future__ import annotations

from uuid import uuid4

from pydantic import JsonValue

from services.compensation import find_target, lock_status
from services.errors import PermanentFailure
from services.params import require_int, require_str
from services.simulated import SimulatedSystem
from services.store import Conn, Q, record_effect
from shared.messages import ActionRequest

CREATE = "erp.create_credit_note"
VOID = "erp.void_credit_note"
VALIDATE = "erp.validate_address"


async def create_credit_note(conn: Conn, req: ActionRequest) -> dict[str, JsonValue]:
    amount = require_int(req, "amount_cents")
    if amount <= 0:
        raise PermanentFailure(f"{CREATE}: amount_cents must be positive, got {amount}")
    credit_note_id = f"cn-{uuid4().hex}"
    await conn.execute(Q.insert_credit_note, credit_note_id, req.order_id, amount)
    await record_effect(conn, req, credit_note_id, {"amount_cents": amount})
    return {"credit_note_id": credit_note_id}


async def void_credit_note(conn: Conn, req: ActionRequest) -> dict[str, JsonValue]:
    credit_note_id = await find_target(conn, req, forward_action=CREATE, id_field="credit_note_id")
    status = await lock_status(conn, req, Q.lock_credit_note, credit_note_id)
    if credit_note_id is None or status != "issued":
        return {"voided": False, "credit_note_id": credit_note_id}
    await conn.execute(Q.void_credit_note, credit_note_id)
    await record_effect(conn, req, credit_note_id)
    return {"voided": True, "credit_note_id": credit_note_id}


async def validate_address(conn: Conn, req: ActionRequest) -> dict[str, JsonValue]:
    normalized = " ".join(require_str(req, "address").split())
    if "closed" in normalized.casefold():
        raise PermanentFailure(f"address {normalized!r} is a closed depot")
    return {"valid": True, "address": normalized}


SYSTEM = SimulatedSystem(
    "erp", {CREATE: create_credit_note, VOID: void_credit_note, VALIDATE: validate_address}
)
