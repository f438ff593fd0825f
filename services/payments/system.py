"""Simulated payments: card charges and refunds (a refund leaves both lines on the statement)."""

from __future__ import annotations

from uuid import uuid4

from pydantic import JsonValue

from services.compensation import target
from services.errors import PermanentFailure
from services.params import require_int, require_str
from services.simulated import SimulatedSystem
from shared.messages import ActionRequest

CHARGE = "payments.charge_card"
REFUND = "payments.refund_charge"
# Like Stripe's test cards: lets users rehearse a declined payment without a fault.
DECLINED_TOKEN_PREFIX = "tok_declined"  # noqa: S105 - a test-card prefix, not a secret


def charge_card(req: ActionRequest) -> dict[str, JsonValue]:
    amount = require_int(req, "amount_cents")
    token = require_str(req, "card_token")
    if amount <= 0:
        raise PermanentFailure(f"{CHARGE}: amount_cents must be positive, got {amount}")
    if token.startswith(DECLINED_TOKEN_PREFIX):
        raise PermanentFailure(f"card {token} was declined")
    return {"payment_id": f"pay-{uuid4().hex}", "amount_cents": amount, "card_token": token}


def refund_charge(req: ActionRequest) -> dict[str, JsonValue]:
    return {**target(req, "payment_id"), "refund_id": f"re-{uuid4().hex}"}


SYSTEM = SimulatedSystem("payments", {CHARGE: charge_card, REFUND: refund_charge})
