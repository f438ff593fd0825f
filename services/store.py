"""Database helpers shared by the simulated systems: the named queries, JSON, effect rows."""

from __future__ import annotations

import json
from datetime import date, datetime
from pathlib import Path
from typing import Any, TypeAlias

import asyncpg
from asyncpg.pool import PoolConnectionProxy
from pydantic import JsonValue

from saga_shared.storage.sql import Queries

Q = Queries(Path(__file__).with_name("queries.sql"))

# A connection of its own or one borrowed from a pool: the systems work on either.
Conn: TypeAlias = asyncpg.Connection | PoolConnectionProxy


def to_json(value: JsonValue) -> str:
    # Pools come from callers without a jsonb codec, so jsonb travels as text both ways.
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def from_json(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def plain(value: object) -> object:
    """A database value as something ``json.dumps`` accepts (datetimes as ISO 8601)."""
    if isinstance(value, datetime | date):
        return value.isoformat()
    return value


def row_dict(row: asyncpg.Record) -> dict[str, object]:
    return {key: plain(value) for key, value in row.items()}
