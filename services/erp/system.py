"""Simulated ERP: credit notes (and voiding them) and a read-only address check."""

from __future__ import annotations

from uuid import uuid4

from pydantic import JsonValue

from services.compensation import target
from services.errors import PermanentFailure
from services.params import require_int, require_str
from services.simulated import SimulatedSystem
from shared.messages import ActionRequest

CREATE = "erp.create_credit_note"
VOID = "erp.void_credit_note"
VALIDATE = "erp.validate_address"


def create_credit_note(req: ActionRequest) -> dict[str, JsonValue]:
    amount = require_int(req, "amount_cents")
    if amount <= 0:
        raise PermanentFailure(f"{CREATE}: amount_cents must be positive, got {amount}")
    return {"credit_note_id": f"cn-{uuid4().hex}", "amount_cents": amount}


def void_credit_note(req: ActionRequest) -> dict[str, JsonValue]:
    return target(req, "credit_note_id")


def validate_address(req: ActionRequest) -> dict[str, JsonValue]:
    """Read-only: the answer is computed here and stored under the key like any other."""
    normalized = " ".join(require_str(req, "address").split())
    if "closed" in normalized.casefold():
        raise PermanentFailure(f"address {normalized!r} is a closed depot")
    return {"valid": True, "address": normalized}


SYSTEM = SimulatedSystem(
    "erp", {CREATE: create_credit_note, VOID: void_credit_note, VALIDATE: validate_address}
)
