"""The four simulated systems, by service name (the routing key of their action queue)."""

from __future__ import annotations

from services.email.system import SYSTEM as EMAIL
from services.erp.system import SYSTEM as ERP
from services.inventory.system import SYSTEM as INVENTORY
from services.payments.system import SYSTEM as PAYMENTS
from services.simulated import SimulatedSystem

SYSTEMS: dict[str, SimulatedSystem] = {s.name: s for s in (INVENTORY, ERP, PAYMENTS, EMAIL)}


def system_for(service: str) -> SimulatedSystem:
    try:
        return SYSTEMS[service]
    except KeyError:
        known = ", ".join(sorted(SYSTEMS))
        raise ValueError(f"unknown service {service!r} (known: {known})") from None


def all_actions() -> list[str]:
    return sorted(action for system in SYSTEMS.values() for action in system.actions)
