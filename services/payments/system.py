"""Simulated payments: card charges and refunds (a refund leaves both lines on the statement)."""

from __future__ import annotations

from saga_services.params import Params, Text
from saga_services.sdk import Call, Result, Undo
from saga_services.simulated import Simulated, new_id, simulated_service

CHARGE = "payments.charge_card"
REFUND = "payments.refund_charge"
# Like Stripe's test cards: lets users rehearse a declined payment without a fault.
DECLINED_TOKEN_PREFIX = "tok_declined"  # noqa: S105 - a test-card prefix, not a secret
SERVICE = simulated_service("payments")


class Charge(Params):
    amount_cents: int
    card_token: Text


class Refund(Undo):
    payment_id: str | None = None


def refusal(charge: Charge) -> str | None:
    """Why a charge is refused before it reaches the card network (both payment services)."""
    if charge.amount_cents <= 0:
        return f"{CHARGE}: amount_cents must be positive, got {charge.amount_cents}"
    if charge.card_token.startswith(DECLINED_TOKEN_PREFIX):
        return f"card {charge.card_token} was declined"
    return None


@SERVICE.action(CHARGE)
async def charge_card(call: Call[Charge, Simulated]) -> Result:
    why = refusal(call.params)
    if why is not None:
        return await call.deps.refuse(call, why)
    p = call.params
    return await call.deps.apply(
        call,
        {"payment_id": new_id("pay"), "amount_cents": p.amount_cents, "card_token": p.card_token},
    )


@SERVICE.compensation(REFUND)
async def refund_charge(call: Call[Refund, Simulated]) -> Result:
    return await call.deps.apply(
        call, {**call.params.target("payment_id"), "refund_id": new_id("re")}
    )
