"""Finding what a compensation undoes, and making "nothing to undo" a safe no-op.

The coordinator passes the forward result's id when it has one. When the forward action failed
with an unknown effect no id reached it, so the compensation names the forward action's
idempotency key instead, and ``sim_target`` (migration 0007) reads its stored outcome, or fences
the key when the forward call never ran.
"""

from __future__ import annotations

from pydantic import JsonValue

from services.errors import PermanentFailure
from services.params import optional_str
from shared.messages import ActionRequest


def target(req: ActionRequest, id_field: str) -> dict[str, JsonValue]:
    """The id to undo, or the forward key to find it by; one of the two is required."""
    given = optional_str(req, id_field)
    if given is not None:
        return {id_field: given}
    forward_key = optional_str(req, "forward_key")
    if forward_key is None:
        raise PermanentFailure(f"{req.action}: give {id_field!r} or 'forward_key'")
    return {"forward_key": forward_key}
