"""A simulated external system with Stripe-like idempotency and fault injection.

Every call runs in ONE transaction: claim the idempotency key, apply any injected fault, run the
handler, store the outcome. A stored outcome (success or failure) is returned for every later
call with that key, so a redelivered or retried request never applies its effect twice.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Literal

import asyncpg
from pydantic import JsonValue

from services.errors import PermanentFailure, TransientFailure
from services.store import Conn, Q, from_json, to_json
from shared.messages import ActionRequest
from shared.sql import VALUE_ERRORS
from shared.text import clean

Handler = Callable[[Conn, ActionRequest], Awaitable[dict[str, JsonValue]]]


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
    def __init__(self, name: str, handlers: Mapping[str, Handler]) -> None:
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
        async with conn.transaction():
            verdict = await self._run(conn, req)
        # Raised only after the commit: the consumed fault must stay consumed.
        if isinstance(verdict, TransientFailure):
            raise verdict
        return verdict

    async def _run(self, conn: Conn, req: ActionRequest) -> Stored | TransientFailure:
        claimed = await conn.fetchval(
            Q.claim_key, req.idempotency_key, self.name, req.action, req.order_id
        )
        if claimed is None:
            return await stored_outcome(conn, req)
        fault = await _injected_fault(conn, req)
        if isinstance(fault, TransientFailure):
            await conn.execute(Q.release_key, req.idempotency_key)
            return fault
        if fault is not None:
            return await _store(conn, req, fault)
        return await _store(conn, req, await self._call_handler(conn, req))

    async def _call_handler(self, conn: Conn, req: ActionRequest) -> Stored:
        handler = self.handlers.get(req.action)
        if handler is None:
            known = ", ".join(self.actions)
            return Stored.failed(f"{self.name} has no action {req.action!r} (known: {known})")
        try:
            # A savepoint: a handler refusing half-way leaves none of its writes behind, while
            # the idempotency claim survives to store the refusal.
            async with conn.transaction():
                return Stored.done(await handler(conn, req))
        except PermanentFailure as exc:
            return Stored.failed(str(exc))
        except VALUE_ERRORS as exc:
            # A value this system cannot take (out of its column's range, a character it
            # refuses): a refusal, nothing landed; retrying would refuse it again.
            return Stored.failed(f"{self.name} refused a value: {clean(str(exc), 500)}")


async def stored_outcome(conn: Conn, req: ActionRequest) -> Stored:
    row = await conn.fetchrow(Q.stored_outcome, req.idempotency_key)
    if row is None:  # pragma: no cover - the claim conflicted, so the row exists
        raise TransientFailure(f"idempotency key {req.idempotency_key!r} vanished; retry")
    if row["action"] != req.action or row["order_id"] != req.order_id:
        # Stripe refuses a key reused with other parameters; reusing one for another action or
        # order is the same mistake, and returning the other call's result would hide it.
        return Stored.failed(
            f"idempotency key {req.idempotency_key!r} was first used for {row['action']} "
            f"on order {row['order_id']}"
        )
    if row["outcome"] == "done":
        return Stored.done(from_json(row["result"]) or {})
    return Stored.failed(row["error"] or "failed")


async def _injected_fault(conn: Conn, req: ActionRequest) -> Stored | TransientFailure | None:
    row = await conn.fetchrow(Q.lock_fault, req.action, req.order_id)
    if row is None:
        return None
    if row["mode"] == "permanent":
        return Stored.failed(f"injected permanent fault on {req.action}")
    left = await conn.fetchval(Q.consume_fault, req.action, req.order_id)
    if left is None:  # transient fault used up: the call goes through
        return None
    return TransientFailure(f"injected transient fault on {req.action} ({left} more to come)")


async def _store(conn: Conn, req: ActionRequest, stored: Stored) -> Stored:
    result = None if stored.result is None else to_json(stored.result)
    await conn.execute(Q.store_outcome, req.idempotency_key, stored.outcome, result, stored.error)
    return stored
