"""The warehouse service's functions against its catalog entries, and its saga in memory with
the test kit: no broker, no database, a fake clock."""

from __future__ import annotations

import asyncio
from pathlib import Path

from saga_app.testkit import SagaKit
from saga_services.sdk import KeyQuery, Resources
from saga_shared.config import Settings
from saga_shared.model.gateway import load_catalog
from saga_shared.model.messages import ActionRequest
from warehouse.service import SERVICE, System

CATALOG = load_catalog(Path(__file__).with_name("catalog.toml"))


def request(action: str, params: dict[str, object], key: str) -> ActionRequest:
    return ActionRequest(
        saga_id="saga-1", order_id="order-1", action=action, step=0, timeout_s=5,
        phase="forward" if action.endswith("create_thing") else "compensation",
        idempotency_key=key, params=params,
    )  # fmt: skip


def test_the_functions_match_the_catalog() -> None:
    SERVICE.check(CATALOG)  # raises naming what disagrees


def test_create_applies_once_per_key_and_cancel_undoes_it() -> None:
    async def scenario() -> None:
        async with SERVICE.open(Resources(Settings())) as system:
            assert isinstance(system, System)
            create = request("warehouse.create_thing", {"label": "x"}, "saga-1:create")
            first = await SERVICE.call(create, system)
            again = await SERVICE.call(create, system)  # a redelivery
            assert again == first
            assert len(system.things) == 1
            undo = request(
                "warehouse.cancel_thing",
                {"thing_id": first["thing_id"], "forward_key": "saga-1:create"},
                "saga-1:cancel",
            )
            assert (await SERVICE.call(undo, system))["cancelled"] is True
            never = request("warehouse.cancel_thing", {"forward_key": "saga-2:create"}, "k")
            assert (await SERVICE.call(never, system)) == {"cancelled": False}
            assert SERVICE.status is not None  # what settles a call cut short
            known = await SERVICE.status(KeyQuery("saga-1:create", "x", "order-1"), system)
            assert (known.state, known.result) == ("done", first)

    asyncio.run(scenario())


def test_the_demo_saga_in_memory_and_a_call_that_never_answers() -> None:
    async def scenario() -> None:
        async with SagaKit(Path(__file__).with_name("catalog.toml"), [SERVICE]) as kit:
            done = await kit.start("warehouse_demo", order_id="o-1", params={"label": "crate"})
            assert kit.status(done) == "completed"

            kit.fail("warehouse.create_thing", "hang")
            stuck = await kit.start("warehouse_demo", order_id="o-2", params={"label": "x"})
            assert kit.status(stuck) == "running"
            for _ in range(3):  # the step's deadline fires; the request is sent again
                await kit.advance(60)
            assert kit.status(stuck) == "compensated"  # undone by its key: nothing to cancel

    asyncio.run(scenario())
