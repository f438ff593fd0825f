"""Simulated e-mail: sending is irreversible, so there is no compensation."""

from __future__ import annotations

from uuid import uuid4

from pydantic import JsonValue

from services.errors import PermanentFailure
from services.params import require_str
from services.simulated import SimulatedSystem
from shared.messages import ActionRequest


def send_email(req: ActionRequest) -> dict[str, JsonValue]:
    """Both e-mail actions: the template is the action's own name."""
    recipient = require_str(req, "customer_email")
    if "@" not in recipient:
        raise PermanentFailure(f"{req.action}: {recipient!r} is not an e-mail address")
    template = req.action.split(".", 1)[1]
    return {"email_id": f"em-{uuid4().hex}", "recipient": recipient, "template": template}


SYSTEM = SimulatedSystem(
    "email", {"email.send_customer_email": send_email, "email.send_confirmation": send_email}
)
