"""Typed access to an action's parameters: a wrong or missing one is a permanent failure.

The gateway checks parameters against the catalog at intake; the systems check again because
they are the last line of defence (a replayed or hand-written message skips the gateway).
"""

from __future__ import annotations

from services.errors import PermanentFailure
from shared.messages import ActionRequest


def require_str(req: ActionRequest, name: str) -> str:
    value = req.params.get(name)
    if not isinstance(value, str) or not value.strip():
        raise PermanentFailure(f"{req.action}: parameter {name!r} must be a non-empty string")
    return value


def require_int(req: ActionRequest, name: str) -> int:
    value = req.params.get(name)
    # bool is an int subclass in Python; `true` is never a quantity.
    if not isinstance(value, int) or isinstance(value, bool):
        raise PermanentFailure(f"{req.action}: parameter {name!r} must be an integer")
    return value


def optional_str(req: ActionRequest, name: str) -> str | None:
    value = req.params.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise PermanentFailure(f"{req.action}: parameter {name!r} must be a non-empty string")
    return value
