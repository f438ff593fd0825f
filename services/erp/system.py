"""Simulated ERP: credit notes (and voiding them) and a read-only address check."""

from __future__ import annotations

from saga_services.params import Params, Text
from saga_services.sdk import Call, Result, Undo
from saga_services.simulated import Simulated, new_id, simulated_service

CREATE = "erp.create_credit_note"
VOID = "erp.void_credit_note"
VALIDATE = "erp.validate_address"
SERVICE = simulated_service("erp")


class Credit(Params):
    amount_cents: int


class Void(Undo):
    credit_note_id: str | None = None


class Address(Params):
    address: Text


@SERVICE.action(CREATE)
async def create_credit_note(call: Call[Credit, Simulated]) -> Result:
    amount = call.params.amount_cents
    if amount <= 0:
        return await call.deps.refuse(
            call, f"{CREATE}: amount_cents must be positive, got {amount}"
        )
    return await call.deps.apply(call, {"credit_note_id": new_id("cn"), "amount_cents": amount})


@SERVICE.compensation(VOID)
async def void_credit_note(call: Call[Void, Simulated]) -> Result:
    return await call.deps.apply(call, call.params.target("credit_note_id"))


@SERVICE.action(VALIDATE)
async def validate_address(call: Call[Address, Simulated]) -> Result:
    """Read-only: the answer is computed here and stored under the key like any other."""
    normalized = " ".join(call.params.address.split())
    if "closed" in normalized.casefold():
        return await call.deps.refuse(call, f"address {normalized!r} is a closed depot")
    return await call.deps.apply(call, {"valid": True, "address": normalized})
