"""The numbered migrations produce exactly the schema the code was written against."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from saga_shared.storage.migrations import discover, drop_database, migrate
from tests.conftest import DATABASE_SERVER

SNAPSHOT = Path(__file__).with_name("schema_snapshot.txt")

DESCRIBE = """
SELECT 'column ' || table_name || '.' || column_name || ' ' || data_type
       || CASE WHEN is_nullable = 'NO' THEN ' not null' ELSE '' END
       || coalesce(' default ' || column_default, '') AS line
FROM information_schema.columns WHERE table_schema = 'public'
UNION ALL
SELECT 'index ' || indexname || ': ' || indexdef FROM pg_indexes WHERE schemaname = 'public'
UNION ALL
SELECT 'constraint ' || conrelid::regclass || ' ' || conname || ': ' || pg_get_constraintdef(oid)
FROM pg_constraint WHERE connamespace = 'public'::regnamespace
ORDER BY 1
"""


async def describe(url: str) -> str:
    conn = await asyncpg.connect(url)
    try:
        return "\n".join(r["line"] for r in await conn.fetch(DESCRIBE)) + "\n"
    finally:
        await conn.close()


async def test_migrations_produce_the_expected_schema_and_run_once() -> None:
    parts = urlsplit(DATABASE_SERVER)
    url = urlunsplit(parts._replace(path=f"/saga_schema_{uuid.uuid4().hex[:8]}"))
    try:
        applied = await migrate(url)
        assert applied == [f"{m.version:04d}_{m.name}" for m in discover()]
        assert await migrate(url) == []  # a second run applies nothing
        schema = await describe(url)
    finally:
        await drop_database(url)
    if os.environ.get("SAGA_UPDATE_SCHEMA_SNAPSHOT") == "1":
        SNAPSHOT.write_text(schema)
    assert schema == SNAPSHOT.read_text(), (
        "the migrations changed the schema: review the difference, then rerun with "
        "SAGA_UPDATE_SCHEMA_SNAPSHOT=1 to accept it"
    )
