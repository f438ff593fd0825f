"""The warehouse service: put your system behind the catalog's warehouse.* actions.

Run it beside the coordinator:  saga run warehouse.service:SERVICE
(with warehouse/ importable and its catalog entries in SAGA_CATALOG_PATH).

A function is called at least once per request, maybe more (a redelivery, a retry): pass
``call.key`` to your system as its idempotency key so the effect is applied once. Raise
``Transient`` when the same call may work later (a timeout, a 5xx), ``Permanent`` when the
system said no; say ``may_have_landed`` when you cannot know whether it acted.

The framework claims each key in the service's key record before every call and stores the
outcome after; when nobody knows whether a call happened (its process was killed mid-call), the
coordinator asks which way it went and the framework answers from that record, fencing a key
nobody claimed. For a call cut short it asks ``status`` below: what your system itself knows
of the key. Without it such a call waits for a person (`saga settle`).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from uuid import uuid4

from pydantic import BaseModel

from saga_services.sdk import (
    Call,
    KeyQuery,
    KeyStatus,
    Permanent,
    Resources,
    Result,
    Service,
    Undo,
)


class System:
    """Stands for your system's client (an httpx.AsyncClient, a database pool): replace it.
    Like a real API with idempotency keys, it applies each key once."""

    def __init__(self) -> None:
        self.things: dict[str, dict[str, object]] = {}
        self.by_key: dict[str, str] = {}

    async def create(self, key: str, label: str) -> str:
        if key not in self.by_key:
            thing_id = f"thing-{uuid4().hex[:12]}"
            self.things[thing_id] = {"label": label, "cancelled": False}
            self.by_key[key] = thing_id
        return self.by_key[key]

    async def cancel(self, thing_id: str) -> bool:
        thing = self.things.get(thing_id)
        if thing is None:
            return False
        thing["cancelled"] = True
        return True


@contextlib.asynccontextmanager
async def connect(resources: Resources) -> AsyncIterator[System]:
    """Opened once when the adapter starts, closed when it stops; read your own settings
    (URLs, credentials) from the environment here."""
    yield System()


async def status(query: KeyQuery, system: System) -> KeyStatus:
    """What your system knows of a key (look it up by the idempotency key you gave it):
    done with the action's result, or "unknown"; say "fenced" only if your system can refuse
    the key from now on."""
    thing_id = system.by_key.get(query.key)
    if thing_id is not None:
        return KeyStatus("done", result={"thing_id": thing_id})
    return KeyStatus("unknown", reason="warehouse has no thing for this key (yet)")


SERVICE = Service("warehouse", setup=connect, status=status)


class Create(BaseModel):
    label: str  # the catalog's params for warehouse.create_thing


class Cancel(Undo):
    # The identifier create_thing returned (its catalog `result`), when it answered; else
    # call.params.forward_key, the key create_thing was called with.
    thing_id: str | None = None


@SERVICE.action("warehouse.create_thing")
async def create_thing(call: Call[Create, System]) -> Result:
    if not call.params.label.strip():
        raise Permanent("warehouse.create_thing: the label is blank")
    return {"thing_id": await call.deps.create(call.key, call.params.label)}


@SERVICE.compensation("warehouse.cancel_thing")
async def cancel_thing(call: Call[Cancel, System]) -> Result:
    target = call.params.target("thing_id")
    thing_id = target.get("thing_id") or call.deps.by_key.get(str(target.get("forward_key")))
    if not isinstance(thing_id, str):
        return {"cancelled": False}  # nothing was created: undoing it is a no-op
    return {"cancelled": await call.deps.cancel(thing_id), "thing_id": thing_id}
