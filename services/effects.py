"""What the simulated systems hold for one order: the ground truth an operator checks a saga
against ("did the release really happen? was anything applied twice?"); and what every
service's adapter called for it, services of one's own included, from the key record."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import asyncpg

from saga_services.store import Q, row_dict

Rows = list[dict[str, object]]
_ISO_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d")

_SECTIONS: tuple[tuple[str, str], ...] = (
    ("reservations", "reservations_for_order"),
    ("credit_notes", "credit_notes_for_order"),
    ("charges", "charges_for_order"),
    ("emails", "emails_for_order"),
    ("applied", "applied_for_order"),
)
# What every service's adapter called (the key record): beside the systems' state, not part of
# it (the in-memory twin of the systems keeps no key record).
_CALLS = ("calls", "calls_for_order")


async def effects_for_order(
    pool: asyncpg.Pool, order_id: str, *, calls: bool = False
) -> dict[str, Rows]:
    """Current rows of every simulated table for the order, plus effects applied per key;
    ``calls``: and every service's calls for it, from the key record."""
    sections = (*_SECTIONS, _CALLS) if calls else _SECTIONS
    async with pool.acquire() as conn, conn.transaction(readonly=True, isolation="repeatable_read"):
        # One snapshot, so the sections agree with each other.
        return {
            section: [row_dict(r) for r in await conn.fetch(getattr(Q, query), order_id)]
            for section, query in sections
        }


def effect_tables(effects: dict[str, Rows]) -> list[tuple[str, list[str], list[list[str]]]]:
    """Each section as a titled table for a person: its title with the count, its columns,
    its cells as text (the CLI draws them)."""
    tables = []
    for section, _ in (*_SECTIONS, _CALLS):
        rows = effects.get(section, [])
        columns = list(rows[0]) if rows else []
        tables.append(
            (
                f"{section} ({len(rows)})",
                columns,
                [[_cell(r.get(c)) for c in columns] for r in rows],
            )
        )
    return tables


def applied_twice(effects: dict[str, Rows]) -> list[str]:
    """The idempotency keys whose effect landed more than once: what must never happen."""
    return [
        str(r["idempotency_key"]) for r in effects.get("applied", []) if _as_int(r.get("times")) > 1
    ]


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, str) and _ISO_TIME.match(value):
        # Full ISO stamps (microseconds, offset) make tables too wide for a terminal.
        return datetime.fromisoformat(value).astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")
    return str(value)


def _as_int(value: object) -> int:
    return value if isinstance(value, int) else 0
