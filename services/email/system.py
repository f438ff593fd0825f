"""Simulated e-mail: sending is irreversible, so there is no compensation."""

from __future__ import annotations

from saga_services.params import Params, Text
from saga_services.sdk import Call, Result
from saga_services.simulated import Simulated, new_id, simulated_service

SERVICE = simulated_service("email")


class Message(Params):
    customer_email: Text


@SERVICE.action("email.send_customer_email")
@SERVICE.action("email.send_confirmation")
async def send_email(call: Call[Message, Simulated]) -> Result:
    """Both e-mail actions: the template is the action's own name."""
    recipient = call.params.customer_email
    if "@" not in recipient:
        return await call.deps.refuse(
            call, f"{call.action}: {recipient!r} is not an e-mail address"
        )
    template = call.action.split(".", 1)[1]
    return await call.deps.apply(
        call, {"email_id": new_id("em"), "recipient": recipient, "template": template}
    )
