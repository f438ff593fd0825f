"""The coordinator's and the adapters' sessions plan their batch statements once
(``SAGA_DB_PLAN_CACHE_MODE``): with Postgres's default each claim is planned again."""

from __future__ import annotations

import asyncpg

from saga_app.stack import Stack
from saga_coordinator.store import Q
from shared.config import Settings
from shared.sql import create_pool


async def test_the_stack_sessions_use_generic_plans(stack: Stack) -> None:
    assert await stack.pool.fetchval("SHOW plan_cache_mode") == "force_generic_plan"


async def test_the_setting_reaches_the_session_and_none_leaves_the_server_default(
    settings: Settings,
) -> None:
    for mode, expected in [("auto", "auto"), ("force_custom_plan", "force_custom_plan"),
                           (None, "auto")]:  # fmt: skip
        pool = await create_pool(settings.database_url, min_size=1, max_size=1,
                                 plan_cache_mode=mode)  # fmt: skip
        try:
            assert await pool.fetchval("SHOW plan_cache_mode") == expected
        finally:
            await pool.close()


async def test_a_generic_claim_finds_sagas_by_their_key(settings: Settings) -> None:
    """The generic plan of the claim, made without the batch's values, still looks each saga
    up by its primary key rather than scanning the table."""
    conn = await asyncpg.connect(settings.database_url)
    try:
        await conn.execute("SET plan_cache_mode = force_generic_plan")
        await conn.execute(f"PREPARE claim_plan AS {Q.claim}")
        rows = await conn.fetch(
            "EXPLAIN EXECUTE claim_plan(ARRAY['o'], ARRAY['m'], ARRAY['s'], ARRAY[''])"
        )
        plan = "\n".join(row[0] for row in rows)
        assert "Index Scan using sagas_pkey on sagas" in plan
        assert "Seq Scan on sagas" not in plan
    finally:
        await conn.close()
