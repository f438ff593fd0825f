"""Numbered SQL migrations (``shared/storage/sql/migrations/NNNN_name.sql``), applied once each."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg

MIGRATIONS_DIR = Path(__file__).with_name("sql") / "migrations"
_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
# Any constant works; it only keeps two concurrent `saga migrate` runs from interleaving.
_LOCK_KEY = 0x5A6A


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    path: Path


def discover(directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    found = []
    for path in sorted(directory.iterdir()):
        match = _FILE.match(path.name)
        if match:
            found.append(Migration(int(match[1]), match[2], path))
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise RuntimeError(f"migrations must be numbered 0001.. without gaps, found {versions}")
    return found


async def ensure_database(url: str) -> bool:
    """Create the database named in ``url`` when it does not exist; True if it was created."""
    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    if not re.fullmatch(r"[A-Za-z0-9_]+", name):
        raise ValueError(f"database name {name!r}: use letters, digits and underscores")
    admin = urlunsplit(parts._replace(path="/postgres"))
    conn = await asyncpg.connect(admin)
    try:
        exists = await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name)
        if exists:
            return False
        # An identifier cannot be a bind parameter; the name was checked against a strict
        # pattern above.
        await conn.execute(f'CREATE DATABASE "{name}"')
        return True
    finally:
        await conn.close()


async def migrate(url: str) -> list[str]:
    """Apply pending migrations, each in its own transaction; return the names applied."""
    await ensure_database(url)
    conn = await asyncpg.connect(url)
    applied: list[str] = []
    try:
        await conn.execute("SELECT pg_advisory_lock($1)", _LOCK_KEY)
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " version integer PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        done = {r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations")}
        for migration in discover():
            if migration.version in done:
                continue
            async with conn.transaction():
                await conn.execute(migration.path.read_text(encoding="utf-8"))
                await conn.execute(
                    "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)",
                    migration.version,
                    migration.name,
                )
            applied.append(f"{migration.version:04d}_{migration.name}")
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", _LOCK_KEY)
        await conn.close()
    return applied


async def pending(url: str) -> list[str]:
    """The migrations this code has that the database lacks (read with any role that may read
    ``schema_migrations``)."""
    conn = await asyncpg.connect(url)
    try:
        exists = await conn.fetchval("SELECT to_regclass('schema_migrations') IS NOT NULL")
        done = (
            {r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations")}
            if exists
            else set()
        )
    finally:
        await conn.close()
    return [f"{m.version:04d}_{m.name}" for m in discover() if m.version not in done]


async def drop_database(url: str) -> None:
    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    if not re.fullmatch(r"[A-Za-z0-9_]+", name):
        raise ValueError(f"database name {name!r}: use letters, digits and underscores")
    conn = await asyncpg.connect(urlunsplit(parts._replace(path="/postgres")))
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()
