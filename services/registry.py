"""The services an adapter process can run: the built-in ones by name, a user's own by
``module:attribute`` (a ``saga_services.sdk.Service`` object)."""

from __future__ import annotations

import importlib
from typing import Any

from saga_services.email.system import SERVICE as EMAIL
from saga_services.erp.system import SERVICE as ERP
from saga_services.inventory.system import SERVICE as INVENTORY
from saga_services.payments.system import SERVICE as PAYMENTS
from saga_services.sdk import Service
from saga_shared.errors import ConfigError

# The adapters of the four simulated systems, by service name.
SYSTEMS: dict[str, Service[Any]] = {s.name: s for s in (INVENTORY, ERP, PAYMENTS, EMAIL)}
# Variants serving the same actions another way, by component name.
VARIANTS: dict[str, str] = {"payments-http": "saga_services.payments_http.adapter:SERVICE"}


def load_service(ref: str) -> Service[Any]:
    """``inventory`` (built in), ``payments-http`` (a variant) or ``package.module:name``."""
    if ref in SYSTEMS:
        return SYSTEMS[ref]
    ref = VARIANTS.get(ref, ref)
    module_name, sep, attribute = ref.partition(":")
    if not sep or not module_name or not attribute:
        known = ", ".join([*SYSTEMS, *VARIANTS])
        raise ConfigError(f"unknown service {ref!r}: give one of {known}, or module:attribute")
    try:
        found = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot load the service {ref!r}: {exc}") from None
    if not isinstance(found, Service):
        raise ConfigError(f"{ref} is a {type(found).__name__}, not a saga_services.sdk.Service")
    return found


def all_actions() -> list[str]:
    return sorted(action for system in SYSTEMS.values() for action in system.actions)
