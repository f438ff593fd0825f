"""Heartbeats (``processes``): each component writes its own row, says when it stops, and in
``roles`` mode cannot make another component look alive."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from prometheus_client import REGISTRY

from saga_coordinator.gauges import read_gauges
from saga_shared.config import Settings
from saga_shared.observability import metrics
from saga_shared.security.identity import database_url_for
from saga_shared.storage.presence import Presence
from tests.integration.helpers import eventually


async def row_of(pool: asyncpg.Pool, presence: Presence) -> asyncpg.Record | None:
    return await pool.fetchrow("SELECT * FROM processes WHERE id = $1", presence.id)


async def test_a_component_beats_and_says_when_it_stops(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    presence = Presence(pool, settings.namespace, "adapter", "email", ["q"], "0.2.0", 0.05)
    beating = asyncio.create_task(presence.run())
    first = await eventually(lambda: row_of(pool, presence), lambda r: r is not None)
    later = await eventually(
        lambda: row_of(pool, presence),
        lambda r: r is not None and first is not None and r["beat_at"] > first["beat_at"],
    )
    assert first is not None and later is not None
    assert later["stopped_at"] is None and later["before_at"] == first["beat_at"]
    beating.cancel()
    with pytest.raises(asyncio.CancelledError):
        await beating
    ended = await row_of(pool, presence)
    assert ended is not None and ended["stopped_at"] is not None


async def test_in_roles_mode_a_service_writes_only_its_own_row(
    role_settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    inventory = await asyncpg.connect(database_url_for(role_settings, "inventory"))
    try:
        own = Presence(inventory, role_settings.namespace, "adapter", "inventory", [], "x")  # type: ignore[arg-type]
        await own.beat()
        forged = Presence(inventory, role_settings.namespace, "adapter", "email", [], "x")  # type: ignore[arg-type]
        await forged.beat()  # refused by the database; said once, and the component goes on
        assert "row-level security" in caplog.text and "run `saga setup`" in caplog.text
        seen = await inventory.fetch("SELECT name FROM processes WHERE namespace = $1",
                                     role_settings.namespace)  # fmt: skip
        assert {r["name"] for r in seen} == {"inventory"}  # it sees only its own, too
    finally:
        await inventory.close()


async def test_a_silent_process_restarted_on_its_host_no_longer_counts_as_silent(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    """Killed (it beat once, then nothing), then started again on the same host: the gauge
    says silent until the new one beats, then alive, and the old row is taken as stopped."""
    every = 0.2  # silent after 0.6 s
    metrics.export_database_gauges()  # as the coordinator does (keep_gauges)
    killed = Presence(pool, settings.namespace, "adapter", "email", [], "0.2.0", every)
    await killed.beat()
    await eventually(lambda: quiet_s(pool, killed), lambda s: s > 3 * every)
    await read_gauges(pool, settings.namespace, every)
    assert await series("email") == {"alive": 0.0, "silent": 1.0}
    restarted = Presence(pool, settings.namespace, "adapter", "email", [], "0.2.0", every)
    await restarted.beat()
    await read_gauges(pool, settings.namespace, every)
    assert await series("email") == {"alive": 1.0, "silent": 0.0}
    old = await row_of(pool, killed)
    assert old is not None and old["stopped_at"] == old["beat_at"]


async def quiet_s(pool: asyncpg.Pool, presence: Presence) -> float:
    return float(await pool.fetchval(
        "SELECT extract(epoch FROM now() - beat_at) FROM processes WHERE id = $1", presence.id
    ))  # fmt: skip


async def series(name: str) -> dict[str, float | None]:
    return {state: REGISTRY.get_sample_value("saga_processes", {"kind": "adapter", "name": name,
                                                                "state": state})
            for state in ("alive", "silent")}  # fmt: skip


async def test_in_roles_mode_the_coordinator_takes_a_replaced_adapter_as_stopped(
    role_settings: Settings,
) -> None:
    every, ns = 0.2, role_settings.namespace
    metrics.export_database_gauges()
    inventory = await asyncpg.create_pool(database_url_for(role_settings, "inventory"))
    coordinator = await asyncpg.create_pool(database_url_for(role_settings, "coordinator"))
    try:
        killed = Presence(inventory, ns, "adapter", "inventory", [], "x", every)
        await killed.beat()
        await eventually(lambda: quiet_s(coordinator, killed), lambda s: s > 3 * every)
        await Presence(inventory, ns, "adapter", "inventory", [], "x").beat()
        await read_gauges(coordinator, ns, every)  # as its own role
        old = await row_of(coordinator, killed)
        assert old is not None and old["stopped_at"] == old["beat_at"]
        assert await series("inventory") == {"alive": 1.0, "silent": 0.0}
    finally:
        await inventory.close()
        await coordinator.close()
