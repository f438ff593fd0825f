"""Simulated inventory: stock reservations and their release."""

from __future__ import annotations

from uuid import uuid4

from pydantic import JsonValue

from services.compensation import find_target, lock_status
from services.errors import PermanentFailure
from services.params import require_int, require_str
from services.simulated import SimulatedSystem
from services.store import Conn, Q, record_effect
from shared.messages import ActionRequest

RESERVE = "inventory.reserve_stock"
RELEASE = "inventory.release_stock"


async def reserve_stock(conn: Conn, req: ActionRequest) -> dict[str, JsonValue]:
    sku = require_str(req, "sku")
    quantity = require_int(req, "quantity")
    if quantity <= 0:
        raise PermanentFailure(f"{RESERVE}: quantity must be positive, got {quantity}")
    reservation_id = f"res-{uuid4().hex}"
    await conn.execute(Q.insert_reservation, reservation_id, req.order_id, sku, quantity)
    await record_effect(conn, req, reservation_id, {"sku": sku, "quantity": quantity})
    return {"reservation_id": reservation_id}


async def release_stock(conn: Conn, req: ActionRequest) -> dict[str, JsonValue]:
    reservation_id = await find_target(conn, req, forward_action=RESERVE, id_field="reservation_id")
    status = await lock_status(conn, req, Q.lock_reservation, reservation_id)
    if reservation_id is None or status != "reserved":
        return {"released": False, "reservation_id": reservation_id}
    await conn.execute(Q.release_reservation, reservation_id)
    await record_effect(conn, req, reservation_id)
    return {"released": True, "reservation_id": reservation_id}


SYSTEM = SimulatedSystem("inventory", {RESERVE: reserve_stock, RELEASE: release_stock})
