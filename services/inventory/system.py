"""Simulated inventory: stock reservations and their release."""

from __future__ import annotations

from saga_services.params import Params, Text
from saga_services.sdk import Call, Result, Undo
from saga_services.simulated import Simulated, new_id, simulated_service

RESERVE = "inventory.reserve_stock"
RELEASE = "inventory.release_stock"
SERVICE = simulated_service("inventory")


class Reserve(Params):
    sku: Text
    quantity: int


class Release(Undo):
    reservation_id: str | None = None


@SERVICE.action(RESERVE)
async def reserve_stock(call: Call[Reserve, Simulated]) -> Result:
    sku, quantity = call.params.sku, call.params.quantity
    if quantity <= 0:
        return await call.deps.refuse(call, f"{RESERVE}: quantity must be positive, got {quantity}")
    return await call.deps.apply(
        call, {"reservation_id": new_id("res"), "sku": sku, "quantity": quantity}
    )


@SERVICE.compensation(RELEASE)
async def release_stock(call: Call[Release, Simulated]) -> Result:
    return await call.deps.apply(call, call.params.target("reservation_id"))
