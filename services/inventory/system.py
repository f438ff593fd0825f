"""Simulated inventory: stock reservations and their release."""

from __future__ import annotations

from uuid import uuid4

from pydantic import JsonValue

from services.compensation import target
from services.errors import PermanentFailure
from services.params import require_int, require_str
from services.simulated import SimulatedSystem
from shared.messages import ActionRequest

RESERVE = "inventory.reserve_stock"
RELEASE = "inventory.release_stock"


def reserve_stock(req: ActionRequest) -> dict[str, JsonValue]:
    sku = require_str(req, "sku")
    quantity = require_int(req, "quantity")
    if quantity <= 0:
        raise PermanentFailure(f"{RESERVE}: quantity must be positive, got {quantity}")
    return {"reservation_id": f"res-{uuid4().hex}", "sku": sku, "quantity": quantity}


def release_stock(req: ActionRequest) -> dict[str, JsonValue]:
    return target(req, "reservation_id")


SYSTEM = SimulatedSystem("inventory", {RESERVE: reserve_stock, RELEASE: release_stock})
