"""The warehouse's saga in memory, step by step (pytest-asyncio, asyncio_mode = "auto")."""

from __future__ import annotations

from pathlib import Path

from warehouse.service import SERVICE

from saga_app.testkit import SagaKit

CATALOG = Path(__file__).parent.parent / "warehouse" / "catalog.toml"


async def test_a_thing_that_is_never_answered_for_is_undone() -> None:
    async with SagaKit(CATALOG, [SERVICE]) as kit:
        kit.fail("warehouse.create_thing", "hang")  # also "permanent", or "transient" times=N
        saga_id = await kit.start("warehouse_demo", order_id="o-1", params={"label": "crate"})
        assert kit.status(saga_id) == "running"
        for _ in range(3):  # each send's deadline fires, and the request goes again
            await kit.advance(60)
        assert kit.status(saga_id) == "compensated"
        assert [r.action for r in kit.requests(saga_id)][-1] == "warehouse.cancel_thing"
        assert kit.deps("warehouse").things == {}  # your system, as setup yielded it
