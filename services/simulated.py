"""What the built-in services' functions call: a simulated system with Stripe-like idempotency
and fault injection, in the saga database.

Every call is ONE statement, ``sim_call`` (migration 0007), and so one transaction: claim the
idempotency key, apply any injected fault, run the action, store the outcome. The function
decides first what needs no database (checking the parameters, new ids, read-only answers) and
hands over the values to write (``apply``) or why it refuses (``refuse``); a refusal is stored
like any other outcome. A stored outcome (success or failure) is returned for every later call
with that key, so a redelivered or retried request never applies its effect twice. The calls of
one delivery batch go out as one ``call_many`` statement: one commit for all of them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import asyncpg

from saga_services.errors import Permanent, Transient
from saga_services.sdk import Call, Coalescer, Resources, Result, Service, mark_recorded
from saga_services.store import Conn, Q, from_json, to_json
from saga_shared.model.ids import random_id

Connect = Callable[[], contextlib.AbstractAsyncContextManager[Conn]]


@dataclass(frozen=True)
class _Write:
    key: str
    action: str
    order_id: str
    values: Result
    refusal: str | None


class Simulated:
    """A simulated system's database side, as ``call.deps`` of its functions."""

    def __init__(self, system: str, connect: Connect) -> None:
        self.system = system
        self._connect = connect
        self._calls: Coalescer[_Write, Result] = Coalescer(self._run_many)

    @classmethod
    def on(cls, system: str, conn: Conn) -> Simulated:
        """Calls on a connection the caller holds (its timeout then covers the call alone)."""

        @contextlib.asynccontextmanager
        async def held() -> AsyncIterator[Conn]:
            yield conn

        return cls(system, held)

    async def apply(self, call: Call[Any, Any], values: Result) -> Result:
        """Write ``values`` under the call's key, once: the result stored for that key (this
        call's, or an earlier one's). Raises ``Permanent`` for a stored refusal or an injected
        permanent fault, ``Transient`` for an injected transient one."""
        result = await self._submit(_Write(call.key, call.action, call.order_id, values, None))
        mark_recorded()  # sim_call stored it as done in the key's row, with the effect
        return result

    async def refuse(self, call: Call[Any, Any], reason: str) -> Result:
        """Store a refusal under the call's key (unless the key already has an outcome, which
        is then returned) and raise it as ``Permanent``."""
        return await self._submit(_Write(call.key, call.action, call.order_id, {}, reason))

    async def _submit(self, write: _Write) -> Result:
        try:
            return await self._calls.submit(write)
        except _Hung:
            # An injected hang: the system never answers; only the caller's timeout ends this.
            await asyncio.get_running_loop().create_future()
            raise

    async def _run_many(self, writes: list[_Write]) -> list[Result | Exception]:
        async with self._connect() as conn:
            if len(writes) == 1:
                w = writes[0]
                row = await conn.fetchrow(
                    Q.call, w.key, self.system, w.action, w.order_id, to_json(w.values), w.refusal
                )
                assert row is not None
                return [_verdict(row)]
            # Key order, so that two batches lock shared rows in the same order.
            order = sorted(range(len(writes)), key=lambda i: writes[i].key)
            rows = await conn.fetch(
                Q.call_many,
                [writes[i].key for i in order],
                [self.system] * len(order),
                [writes[i].action for i in order],
                [writes[i].order_id for i in order],
                [to_json(writes[i].values) for i in order],
                [writes[i].refusal for i in order],
                order,
            )
        out: list[Result | Exception | None] = [None] * len(writes)
        for row in rows:
            out[row["n"]] = _verdict(row)
        if any(v is None for v in out):
            raise Transient(f"{self.system}: a batch of {len(writes)} came back incomplete")
        return [v for v in out if v is not None]


class _Hung(Exception):
    """``sim_call`` said: this call hangs (an injected ``hang`` fault; nothing landed)."""


def _verdict(row: asyncpg.Record) -> Result | Exception:
    if row["call_outcome"] == "hang":
        return _Hung(row["call_error"])
    if row["call_transient"]:
        return Transient(row["call_error"])
    if row["call_outcome"] == "done":
        result: Result = from_json(row["call_result"]) or {}
        return result
    return Permanent(row["call_error"] or "failed")


def simulated_service(system: str) -> Service[Simulated]:
    """A built-in service whose functions reach their simulated system as ``call.deps``. Its
    effects commit in the same transaction as the key's row (``sim_call``): ``atomic``."""

    @contextlib.asynccontextmanager
    async def setup(resources: Resources) -> AsyncIterator[Simulated]:
        if resources.pool is None:
            # Imported here: the in-memory twin imports this module.
            from saga_services.simulated_memory import MemorySimulated, MemorySystems

            if not isinstance(resources.memory, MemorySystems):
                raise RuntimeError(
                    f"the simulated {system} needs the saga database's pool (or a MemorySystems "
                    "as Resources.memory)"
                )
            # The adapter's key record is the twin's too: one row per key, as in Postgres.
            yield MemorySimulated(system, resources.memory, resources.keys)
            return
        yield Simulated(system, resources.pool.acquire)

    return Service(system, setup=setup, atomic=True)


def new_id(prefix: str) -> str:
    return f"{prefix}-{random_id().replace('-', '')}"
