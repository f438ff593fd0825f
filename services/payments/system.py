"""Simulated payments: card charges and refunds (a refund leaves both lines on the statement)."""

from __future__ import annotations

from uuid import uuid4

from pydantic import JsonValue

from services.compensation import find_target, lock_status
from services.errors import PermanentFailure
from services.params import require_int, require_str
from services.simulated import SimulatedSystem
from services.store import Conn, Q, record_effect
from shared.messages import ActionRequest

CHARGE = "payments.charge_card"
REFUND = "payments.refund_charge"
# Like Stripe's test cards: lets users rehearse a declined payment without a fault.
DECLINED_TOKEN_PREFIX = "tok_declined"  # noqa: S105 - a test-card prefix, not a secret


async def charge_card(conn: Conn, req: ActionRequest) -> dict[str, JsonValue]:
    amount = require_int(req, "amount_cents")
    token = require_str(req, "card_token")
    if amount <= 0:
        raise PermanentFailure(f"{CHARGE}: amount_cents must be positive, got {amount}")
    if token.startswith(DECLINED_TOKEN_PREFIX):
        raise PermanentFailure(f"card {token} was declined")
    payment_id = f"pay-{uuid4().hex}"
    await conn.execute(Q.insert_charge, payment_id, req.order_id, amount, token)
    await record_effect(conn, req, payment_id, {"amount_cents": amount})
    return {"payment_id": payment_id}


async def refund_charge(conn: Conn, req: ActionRequest) -> dict[str, JsonValue]:
    payment_id = await find_target(conn, req, forward_action=CHARGE, id_field="payment_id")
    status = await lock_status(conn, req, Q.lock_charge, payment_id)
    if payment_id is None or status != "charged":
        return {"refunded": False, "payment_id": payment_id, "refund_id": None}
    refund_id = f"re-{uuid4().hex}"
    await conn.execute(Q.refund_charge, payment_id, refund_id)
    await record_effect(conn, req, payment_id, {"refund_id": refund_id})
    return {"refunded": True, "payment_id": payment_id, "refund_id": refund_id}


SYSTEM = SimulatedSystem("payments", {CHARGE: charge_card, REFUND: refund_charge})
