"""Simulated e-mail: sending is irreversible, so there is no compensation."""

from __future__ import annotations

from uuid import uuid4

from pydantic import JsonValue

from services.errors import PermanentFailure
from services.params import require_str
from services.simulated import SimulatedSystem
from services.store import Conn, Q, record_effect
from shared.messages import ActionRequest


async def send_email(conn: Conn, req: ActionRequest) -> dict[str, JsonValue]:
    """Both e-mail actions: the template is the action's own name."""
    recipient = require_str(req, "customer_email")
    if "@" not in recipient:
        raise PermanentFailure(f"{req.action}: {recipient!r} is not an e-mail address")
    template = req.action.split(".", 1)[1]
    email_id = f"em-{uuid4().hex}"
    await conn.execute(Q.insert_email, email_id, req.order_id, recipient, template)
    await record_effect(conn, req, email_id, {"template": template})
    return {"email_id": email_id}


SYSTEM = SimulatedSystem(
    "email", {"email.send_customer_email": send_email, "email.send_confirmation": send_email}
)
