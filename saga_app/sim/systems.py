"""What the simulation's adapters call: the four built-in simulated systems in memory
(``saga_services.simulated_memory``, atomic with their key record), and a system of one's own
written
with the adapter SDK as a user would: an SMS gateway, irreversible, NOT atomic with the key
record (it is somewhere else), which may answer late or land after its caller gave up, with or
without a ``status`` hook. Its catalog entry and a saga using it join the shipped catalog."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from saga_services.sdk import Call, KeyQuery, KeyStatus, Resources, Result, Service
from saga_shared.model.catalog import Catalog
from saga_shared.model.gateway import check_catalog

SMS = "sms.send_text"


@dataclass
class Gateway:
    """An SMS gateway that honours idempotency keys (a second send with a key answers the
    first's id) and lands each text a little after it is asked, even once the caller has
    stopped waiting: ``delay_s`` per order (a slow or stuck network)."""

    sent: dict[str, tuple[str, str, float]] = field(default_factory=dict)  # key -> (id, order, at)
    delay_s: dict[str, float] = field(default_factory=dict)
    landing: dict[str, asyncio.Task[str]] = field(default_factory=dict)
    count: int = 0

    async def send(self, key: str, order_id: str, to: str) -> str:
        if key in self.sent:
            return self.sent[key][0]
        task = self.landing.get(key)
        if task is None:  # the gateway keeps going whatever its caller does
            task = asyncio.ensure_future(self._land(key, order_id, self.delay_s.get(order_id, 0)))
            self.landing[key] = task
        return await asyncio.shield(task)

    async def _land(self, key: str, order_id: str, delay: float) -> str:
        if delay:
            await asyncio.sleep(delay)
        self.count += 1
        text_id = f"sms-{self.count}"
        self.sent[key] = (text_id, order_id, asyncio.get_running_loop().time())
        self.landing.pop(key, None)
        return text_id


class Text(BaseModel):
    customer_phone: str


def sms_service(gateway: Gateway, *, status: bool) -> Service[Gateway]:
    """The gateway's service; ``status``: whether it has a ``status`` hook (the gateway's own
    record says whether a key was sent)."""

    @contextlib.asynccontextmanager
    async def setup(resources: Resources) -> AsyncIterator[Gateway]:
        yield gateway

    async def look(query: KeyQuery, deps: Gateway) -> KeyStatus:
        if query.key in deps.sent:
            return KeyStatus("done", result={"text_id": deps.sent[query.key][0]})
        return KeyStatus("unknown", reason="the gateway has no record of it (yet)")

    service: Service[Gateway] = Service("sms", setup=setup, status=look if status else None)

    @service.action(SMS, params=Text)
    async def send(call: Call[Text, Gateway]) -> Result:
        phone = call.params.customer_phone
        return {"text_id": await call.deps.send(call.key, call.order_id, phone)}

    return service


def sim_catalog(shipped: Catalog) -> Catalog:
    """The shipped catalog, with the SMS action and a saga that ends with it."""
    raw: dict[str, Any] = shipped.model_dump(mode="json", by_alias=True)
    raw["actions"][SMS] = {
        "class": "irreversible", "description": "Text the customer", "timeout_s": 2,
        "params": {"customer_phone": "str"}, "result": ["text_id"],
        "retry": {"attempts": 3, "initial_backoff_s": 0.05, "max_backoff_s": 0.5},
    }  # fmt: skip
    raw["sagas"]["refund_by_text"] = {
        "description": "Hold the returned stock, credit the customer, text them",
        "steps": ["inventory.reserve_stock", "erp.create_credit_note", SMS],
    }
    catalog = Catalog.model_validate(raw)
    check_catalog(catalog)
    return catalog
