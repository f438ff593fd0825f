"""What the console shows, read from Postgres as the read-only role: the same store and desk
reads the CLI uses, and the console's own lists (``views.sql``)."""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, get_args

import asyncpg

from saga_app.moments import parse_moment
from saga_coordinator.desk import DeadLetterDesk, DeadLetterNotFound
from saga_coordinator.incident import incident, render_markdown
from saga_coordinator.processor import Processor
from saga_coordinator.register import SagaState, SagaStatus
from saga_coordinator.store import Store
from saga_shared.model.catalog import Catalog
from saga_shared.model.text import clean
from saga_shared.storage.sql import Queries
from saga_shared.transport.topology import Topology

Q = Queries(Path(__file__).with_name("views.sql"))
STATUSES: tuple[str, ...] = get_args(SagaStatus)
PAGE = 50
_ID = re.compile(r"^[A-Za-z0-9_.:@-]{1,128}$")
# W3C trace context: version, trace id, parent span id, flags; the trace id is what a UI finds.
_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}$")


def well_formed(value: str) -> bool:
    """Whether ``value`` can be an identifier at all (a saga or order ID from a URL)."""
    return bool(_ID.match(value))


def letter_number(text: str) -> int | None:
    """A dead letter's number from a URL or a form, or None when it cannot be one."""
    if not text.isdigit() or len(text) > 18:
        return None
    number = int(text)
    return number if number >= 1 else None


def text_filter(query: dict[str, str], name: str, limit: int = 200) -> str | None:
    """A free-text filter (a reason): printable, and short; BadFilter otherwise."""
    value = query.get(name, "").strip()
    if not value:
        return None
    if len(value) > limit or not value.isprintable():
        raise BadFilter(f"{name}: up to {limit} printable characters")
    return value


class BadFilter(ValueError):
    """A filter a person typed that means nothing: shown back to them, never a 500."""


@dataclass(frozen=True)
class SagaFilter:
    status: str | None = None
    saga: str | None = None
    order_id: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    after: tuple[datetime, str] | None = None  # the last row of the page before

    @classmethod
    def parse(cls, query: dict[str, str]) -> SagaFilter:
        text = functools.partial(id_filter, query)
        status = text("status")
        if status is not None and status not in STATUSES:
            raise BadFilter(f"status: one of {', '.join(STATUSES)}")
        return cls(
            status,
            text("saga"),
            text("order"),
            _moment(query, "since"),
            _moment(query, "until"),
            _cursor(query.get("after", "")),
        )


def id_filter(query: dict[str, str], name: str) -> str | None:
    value = query.get(name, "").strip()
    if value and not _ID.match(value):
        raise BadFilter(f"{name}: letters, digits and _ . : @ - only, up to 128")
    return value or None


def _moment(query: dict[str, str], name: str) -> datetime | None:
    value = query.get(name, "").strip()
    if not value:
        return None
    try:
        return parse_moment(value)
    except ValueError as exc:
        raise BadFilter(f"{name}: {exc}") from None


def _cursor(value: str) -> tuple[datetime, str] | None:
    if not value:
        return None
    moment, _, saga_id = value.partition("|")
    try:
        parsed = datetime.fromisoformat(moment)
    except ValueError:
        raise BadFilter("after: not a page of this list") from None
    if not _ID.match(saga_id) or parsed.tzinfo is None:
        raise BadFilter("after: not a page of this list")
    return parsed, saga_id


def cursor_of(row: dict[str, Any]) -> str:
    return f"{row['created_at'].isoformat()}|{row['saga_id']}"


class ConsoleReads:
    def __init__(self, pool: asyncpg.Pool, catalog: Catalog, topology: Topology) -> None:
        self.pool = pool
        self.topology = topology
        self.store = Store(pool)
        self.desk = DeadLetterDesk(self.store, Processor(catalog, topology))

    async def sagas(self, f: SagaFilter, limit: int = PAGE) -> list[dict[str, Any]]:
        after_at, after_id = f.after if f.after else (None, None)
        rows = await self.pool.fetch(
            Q.sagas_page,
            f.status,
            f.saga,
            f.order_id,
            f.since,
            f.until,
            after_at,
            after_id,
            limit,
        )
        return [dict(r) for r in rows]

    async def abortable(self, f: SagaFilter, limit: int) -> list[tuple[str, str]]:
        rows = await self.pool.fetch(
            Q.abortable, f.status, f.saga, f.order_id, f.since, f.until, limit
        )
        return [(r["saga_id"], r["order_id"]) for r in rows]

    async def dead_ids(self, order_id: str | None, reason: str | None) -> list[int]:
        return [r["id"] for r in await self.pool.fetch(Q.dead_ids, order_id, reason)]

    async def counts(self) -> dict[str, int]:
        found = {r["status"]: r["n"] for r in await self.pool.fetch(Q.status_counts)}
        return {s: found.get(s, 0) for s in STATUSES}

    async def saga(self, saga_id: str) -> dict[str, Any] | None:
        state = await self.store.get(saga_id)
        if state is None:
            return None
        return {
            "state": state,
            "report": incident(state),
            "markdown": render_markdown(state),
            "history": await self.store.history(saga_id),
            "blocks": await self.store.blocks(state.order_id),
            "parked": await self.store.parked(state.order_id),
            "deadline": await self.pool.fetchrow(Q.deadline_of, saga_id),
        }

    async def people(self, limit: int = 200) -> list[tuple[SagaState, datetime]]:
        rows = await self.pool.fetch(Q.people_queue, limit)
        return [(SagaState.model_validate_json(r["state"]), r["updated_at"]) for r in rows]

    async def dead_letter_groups(self) -> dict[str, list[dict[str, Any]]]:
        return {
            "by_reason": [dict(r) for r in await self.pool.fetch(Q.dead_by_reason)],
            "by_order": [dict(r) for r in await self.pool.fetch(Q.dead_by_order, 200)],
            "by_error": [dict(r) for r in await self.pool.fetch(Q.dead_by_error)],
            "blocked": await self.store.blocked_orders(200),
        }

    async def dead_letters(
        self, order_id: str | None, reason: str | None, status: str | None
    ) -> list[dict[str, Any]]:
        return await self.desk.list(order_id=order_id, reason=reason, status=status, limit=500)

    async def dead_letter(self, dl_id: int | None) -> dict[str, Any]:
        """The letter, its body and headers as text; DeadLetterNotFound when there is none."""
        if dl_id is None:
            raise DeadLetterNotFound("no such dead letter")
        found = await self.desk.get(dl_id)
        body: bytes = found.pop("body")
        try:
            found["body"] = json.dumps(json.loads(body), indent=2, ensure_ascii=True)
        except (ValueError, UnicodeDecodeError, RecursionError):
            found["body"] = clean(body.decode("utf-8", "replace"), 20_000)
        parent = (found["headers"] or {}).get("traceparent")
        trace = _TRACEPARENT.match(parent) if isinstance(parent, str) else None
        found["trace_id"] = trace.group(1) if trace and set(trace.group(1)) != {"0"} else None
        found["headers"] = json.dumps(found["headers"], indent=2, ensure_ascii=True, default=str)
        return found

    async def processes(self) -> list[dict[str, Any]]:
        return [dict(r) for r in await self.pool.fetch(Q.processes, self.topology.namespace)]

    async def rejections(self, order_id: str | None) -> list[dict[str, Any]]:
        return await self.store.rejections(order_id, 200)
