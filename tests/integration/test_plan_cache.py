"""The coordinator's and the adapters' sessions plan their batch statements once
(``SAGA_DB_PLAN_CACHE_MODE``): with Postgres's default each claim is planned again. A generic
plan is kept for the session's life, so it must look rows up by key whatever the tables held
when it was made."""

from __future__ import annotations

import re

import asyncpg
import pytest

from saga_app.stack import Stack
from saga_coordinator.store import Q
from saga_shared.config import Settings
from saga_shared.storage.sql import create_pool
from tests.integration.helpers import own_database


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


@pytest.mark.parametrize("name", ["apply_batch", "write_batch"])
async def test_generic_writes_find_orders_and_sagas_by_their_key(
    settings: Settings, name: str
) -> None:
    """Planned on a new database (a new deployment, each benchmark run), before autovacuum has
    analyzed anything, the write statements still update each order and saga through its
    primary key. Joined on a batch's arrays alone, they were planned as hash joins over a scan
    of both tables, and kept that plan as the tables grew: 0.8 ms a statement at 3,300 sagas."""
    async with own_database(settings.database_url, "saga_plan") as url:
        conn = await asyncpg.connect(url)
        try:
            await conn.execute("SET plan_cache_mode = force_generic_plan")
            query = getattr(Q, name)
            arguments = len((await conn.prepare(query)).get_parameters())
            await conn.execute(f"PREPARE plan AS {query}")
            nulls = ", ".join(["NULL"] * arguments)
            plan = "\n".join(r[0] for r in await conn.fetch(f"EXPLAIN EXECUTE plan({nulls})"))
        finally:
            await conn.close()
    assert "Seq Scan on sagas" not in plan, plan
    assert "Seq Scan on orders" not in plan, plan
    assert re.search(r"Index Scan (using|on) orders_pkey", plan), plan
