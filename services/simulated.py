"""A simulated external system with Stripe-like idempotency and fault injection.

Every call is ONE statement, ``sim_call`` (migration 0007), and so one transaction: claim the
idempotency key, apply any injected fault, run the action, store the outcome. What needs no
database (checking the parameters, choosing new ids, read-only answers) is decided here first
by the action's ``Prepare`` function; a refusal it raises is stored like any other outcome. A
stored outcome (success or failure) is returned for every later call with that key, so a
redelivered or retried request never applies its effect twice.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import asyncpg
from pydantic import JsonValue

from services.errors import PermanentFailure, TransientFailure
from services.store import Conn, Q, from_json, to_json
from shared.messages import ActionRequest

# The values the action writes (new ids included), checked; raises PermanentFailure to refuse.
Prepare = Callable[[ActionRequest], dict[str, JsonValue]]


@dataclass(frozen=True)
class Stored:
    """The outcome stored for one idempotency key."""

    outcome: Literal["done", "failed"]
    result: dict[str, JsonValue] | None = None
    error: str | None = None

    @classmethod
    def done(cls, result: dict[str, JsonValue]) -> Stored:
        return cls("done", result, None)

    @classmethod
    def failed(cls, error: str) -> Stored:
        return cls("failed", None, error)


class SimulatedSystem:
    def __init__(self, name: str, handlers: Mapping[str, Prepare]) -> None:
        self.name = name
        self.handlers = dict(handlers)

    @property
    def actions(self) -> list[str]:
        return sorted(self.handlers)

    async def execute(self, pool: asyncpg.Pool, req: ActionRequest) -> Stored:
        """Run ``req`` at most once per idempotency key; raise ``TransientFailure`` when the call
        did not land (nothing is stored then, so a retry runs it for real)."""
        async with pool.acquire() as conn:
            return await self.execute_on(conn, req)

    async def execute_on(self, conn: Conn, req: ActionRequest) -> Stored:
        """``execute`` on a connection the caller holds (the adapter's timeout then covers the
        call alone, not the wait for a free connection of its own pool)."""
        values, refusal = self.prepare(req)
        row = await conn.fetchrow(
            Q.call, req.idempotency_key, self.name, req.action, req.order_id,
            to_json(values), refusal,
        )  # fmt: skip
        assert row is not None
        verdict = _verdict(row)
        if isinstance(verdict, TransientFailure):
            raise verdict
        return verdict

    async def execute_many(
        self, conn: Conn, reqs: Sequence[ActionRequest]
    ) -> list[Stored | TransientFailure]:
        """``execute_on`` for several requests in one statement, hence one transaction: the
        verdict of each, in order. Raises if any call raises (nothing is then stored). The
        calls run in key order so that two batches lock shared rows in the same order."""
        order = sorted(range(len(reqs)), key=lambda i: reqs[i].idempotency_key)
        prepared = [self.prepare(reqs[i]) for i in order]
        rows = await conn.fetch(
            Q.call_many,
            [reqs[i].idempotency_key for i in order],
            [self.name] * len(order),
            [reqs[i].action for i in order],
            [reqs[i].order_id for i in order],
            [to_json(values) for values, _ in prepared],
            [refusal for _, refusal in prepared],
            order,
        )
        verdicts: list[Stored | TransientFailure | None] = [None] * len(reqs)
        for row in rows:
            verdicts[row["n"]] = _verdict(row)
        if any(v is None for v in verdicts):
            raise TransientFailure(f"{self.name}: a batch of {len(reqs)} came back incomplete")
        return [v for v in verdicts if v is not None]

    def prepare(self, req: ActionRequest) -> tuple[dict[str, JsonValue], str | None]:
        """The values the call writes, or why it refuses (stored as its outcome unless a fault
        or an earlier outcome for the key comes first)."""
        handler = self.handlers.get(req.action)
        if handler is None:
            known = ", ".join(self.actions)
            return {}, f"{self.name} has no action {req.action!r} (known: {known})"
        try:
            return handler(req), None
        except PermanentFailure as exc:
            return {}, str(exc)


def _verdict(row: asyncpg.Record) -> Stored | TransientFailure:
    if row["call_transient"]:
        return TransientFailure(row["call_error"])
    if row["call_outcome"] == "done":
        return Stored.done(from_json(row["call_result"]) or {})
    return Stored.failed(row["call_error"] or "failed")
