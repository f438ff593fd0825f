"""A claim of an atomic system's key commits without waiting for its WAL flush (``key_claim``,
migration 0012: it lands nothing; the system's own statement commits the effect, and its flush
carries the claim's record with it); a claim before a call to any other system waits, as every
other commit does. Set for the claim's transaction only: the session keeps the server's."""

from __future__ import annotations

import uuid

import asyncpg
import pytest

from saga_services.keys import Q


@pytest.mark.parametrize("atomic", [True, False], ids=["atomic", "not-atomic"])
async def test_only_an_atomic_system_s_claim_skips_the_flush(
    pool: asyncpg.Pool, atomic: bool
) -> None:
    key = f"durability-{uuid.uuid4().hex}"
    async with pool.acquire() as conn:
        server = await conn.fetchval("SHOW synchronous_commit")
        assert server != "off"  # what every other commit of the product relies on
        async with conn.transaction():  # the claim's own transaction, held open to look at it
            [row] = await conn.fetch(Q.claim, "durability", "owner-1", atomic, [key],
                                     ["durability.send"], ["O-1"], [1], [3], [60.0])  # fmt: skip
            assert row["verdict"] == "call"
            at_commit = await conn.fetchval("SHOW synchronous_commit")
        assert at_commit == ("off" if atomic else server)
        assert await conn.fetchval("SHOW synchronous_commit") == server
        await conn.execute("DELETE FROM service_keys WHERE key = $1", key)
