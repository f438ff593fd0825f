"""Each service's key record: what the adapter SDK claims before every call and stores after,
and what a settle answers from. One narrow interface, ``KeyStore``, with two implementations
held to the same contract (``tests/twins/test_key_store_contract.py``): ``PgKeys``
(``service_keys``, migration 0012) and ``MemoryKeys`` (the test kit, the simulation).

A claim is the atomic insert-if-absent of the key with an owner (the adapter process), a lease
(at least the call's deadline) and an attempt number raised by every claim of the same send,
so crashes, batch re-runs and resends all count against the catalog's attempts. A settle
inserts the key as *fenced* when nobody claimed it: every later claim then fails on it and
nothing is done. Nothing ever writes a claim over a fence.

``atomic`` stores (the simulated systems: their effect commits in the same transaction as the
key's row) know that a claim left unfinished landed nothing: it may be taken over or fenced at
any time. For any other system an unfinished claim is in doubt once its lease has expired: the
service's ``status`` hook decides, or a person (see ``saga_coordinator.doubt``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Literal, Protocol

import asyncpg
from pydantic import JsonValue

from saga_services.store import from_json, to_json
from saga_shared.storage.sql import Queries

Q = Queries(Path(__file__).with_name("keys.sql"))
Result = dict[str, JsonValue]
TicketKind = Literal["call", "done", "failed", "fenced", "busy", "spent"]
Found = Literal["done", "failed", "fenced", "running", "expired"]


@dataclass(frozen=True)
class Claiming:
    """One key to claim: ``send`` is the coordinator's send number, ``limit`` the catalog's
    attempts per send, ``lease_s`` how long nobody may fence the claim."""

    key: str
    action: str
    order_id: str
    send: int
    limit: int
    lease_s: float


@dataclass(frozen=True)
class Ticket:
    """What a claim said: ``call`` (attempt n is this process's), or why not to call."""

    kind: TicketKind
    attempt: int = 0
    result: Result | None = None
    error: str | None = None
    landed: bool = False  # a try may have landed (spent, busy, failed)
    owner: str | None = None
    lease_s: float | None = None  # busy: how long the other claim stays live


@dataclass(frozen=True)
class Finished:
    """An outcome to store: ``released`` gives the claim up unfinished (the call may have
    landed): its lease ends now, so a settle may see it expired; ``returned`` also gives the
    try back (the function broke: its message is bounded by the delivery limit and ends in
    the dead letters, where an operator replays it once it is fixed)."""

    key: str
    outcome: Literal["done", "failed", "released", "returned"]
    result: Result | None = None
    error: str | None = None
    landed: bool = False


@dataclass(frozen=True)
class KeyState:
    """What a settle found: the stored outcome, a fence (``fenced_now``: by this settle), or an
    unfinished claim (``running``: live for ``lease_s`` more; ``expired``: since ``lease_s``)."""

    found: Found
    result: Result | None = None
    error: str | None = None
    landed: bool = False
    owner: str | None = None
    lease_s: float | None = None
    fenced_now: bool = False
    claims: int = 0  # calls that have claimed the key so far, every send (only ever raised)


class KeyStore(Protocol):
    atomic: bool

    async def claim(self, service: str, owner: str, claims: Sequence[Claiming]) -> list[Ticket]:
        """One statement for the batch; a ticket per claim, in order."""

    async def finish(self, owner: str, finished: Sequence[Finished]) -> None:
        """Store the outcomes of this owner's claims still unfinished (one statement)."""

    async def settle(self, key: str, service: str, action: str, order_id: str) -> KeyState:
        """Fence the key if nobody claimed it (or, atomic, if nobody finished it); else say
        what is stored or who holds it."""

    async def fence(
        self, key: str, service: str, action: str, order_id: str, reason: str,
        claims: int | None = None,
    ) -> KeyState:  # fmt: skip
        """Fence an unfinished claim whose lease has expired (a key nobody claimed too);
        ``claims``: only if no call claimed it since that many claims (a person's word covers
        the calls they knew of). What the key holds after."""

    async def record(self, key: str, result: Result) -> None:
        """An unfinished claim's system said it is done (a ``status`` hook): store it."""


class PgKeys:
    """``service_keys``, through the service's pool."""

    def __init__(self, pool: asyncpg.Pool, *, atomic: bool = False) -> None:
        self.pool = pool
        self.atomic = atomic

    async def claim(self, service: str, owner: str, claims: Sequence[Claiming]) -> list[Ticket]:
        rows = await self.pool.fetch(
            Q.claim, service, owner, self.atomic, [c.key for c in claims],
            [c.action for c in claims], [c.order_id for c in claims], [c.send for c in claims],
            [c.limit for c in claims], [c.lease_s for c in claims],
        )  # fmt: skip
        tickets: list[Ticket | None] = [None] * len(claims)
        for row in rows:
            tickets[row["n"] - 1] = Ticket(
                row["verdict"], row["attempt"], from_json(row["result"]), row["error"],
                row["landed"], row["owner"], row["lease_left"],
            )  # fmt: skip
        assert all(t is not None for t in tickets), "key_claim skipped a key"
        return [t for t in tickets if t is not None]

    async def finish(self, owner: str, finished: Sequence[Finished]) -> None:
        if not finished:
            return
        await self.pool.execute(
            Q.finish, owner, [f.key for f in finished], [f.outcome for f in finished],
            [None if f.result is None else to_json(f.result) for f in finished],
            [f.error for f in finished], [f.landed for f in finished],
        )  # fmt: skip

    async def settle(self, key: str, service: str, action: str, order_id: str) -> KeyState:
        row = await self.pool.fetchrow(Q.settle, key, service, action, order_id, self.atomic)
        assert row is not None
        return _state(row)

    async def fence(
        self, key: str, service: str, action: str, order_id: str, reason: str,
        claims: int | None = None,
    ) -> KeyState:  # fmt: skip
        row = await self.pool.fetchrow(Q.fence, key, service, action, order_id, reason, claims)
        assert row is not None
        return _state(row)

    async def record(self, key: str, result: Result) -> None:
        await self.pool.execute(Q.record, key, to_json(result))


def _state(row: asyncpg.Record) -> KeyState:
    return KeyState(
        row["verdict"], from_json(row["result"]), row["error"], row["landed"], row["owner"],
        row["lease_left"], row["fenced_now"], row["claims"],
    )  # fmt: skip


@dataclass
class _Row:
    action: str
    order_id: str
    outcome: str  # pending | done | failed | fenced
    owner: str | None = None
    lease_until: datetime | None = None
    send: int = 0
    attempt: int = 0
    result: Result | None = None
    error: str | None = None
    landed: bool = False
    claims: int = 0


class MemoryKeys:
    """The in-memory twin of ``PgKeys``; ``clock`` gives the time leases are read against."""

    def __init__(self, clock: _Clock, *, atomic: bool = False) -> None:
        self.rows: dict[str, _Row] = {}
        self.clock = clock
        self.atomic = atomic

    async def claim(self, service: str, owner: str, claims: Sequence[Claiming]) -> list[Ticket]:
        return [self._claim(owner, c) for c in claims]

    def _claim(self, owner: str, c: Claiming) -> Ticket:
        now = self.clock()
        until = now + timedelta(seconds=c.lease_s)
        row = self.rows.get(c.key)
        if row is None:
            self.rows[c.key] = _Row(c.action, c.order_id, "pending", owner, until, c.send, 1,
                                    claims=1)  # fmt: skip
            return Ticket("call", 1, owner=owner, lease_s=c.lease_s)
        if (row.action, row.order_id) != (c.action, c.order_id):
            error = (f"idempotency key {c.key!r} was first used for {row.action} on order "
                     f"{row.order_id}")  # fmt: skip
            return Ticket("failed", row.attempt, error=error, owner=row.owner)
        if row.outcome != "pending":
            kind: TicketKind = row.outcome  # type: ignore[assignment]
            return Ticket(kind, row.attempt, row.result, row.error, row.landed, row.owner)
        if not self.atomic and row.owner is not None and row.owner != owner:
            left = max((row.lease_until or now) - now, timedelta(0)).total_seconds()
            return Ticket("busy", row.attempt, landed=row.landed, owner=row.owner, lease_s=left)
        attempt = row.attempt + 1 if row.send == c.send else 1
        if row.send > c.send or attempt > c.limit:
            return Ticket("spent", row.attempt, landed=row.landed, owner=row.owner)
        row.owner, row.send, row.attempt, row.lease_until = owner, c.send, attempt, until
        row.claims += 1
        return Ticket("call", attempt, landed=row.landed, owner=owner, lease_s=c.lease_s)

    async def finish(self, owner: str, finished: Sequence[Finished]) -> None:
        for f in finished:
            row = self.rows.get(f.key)
            if row is None or row.outcome != "pending" or row.owner != owner:
                continue
            row.landed = row.landed or f.landed
            if f.outcome in ("released", "returned"):
                row.lease_until = self.clock()
                row.attempt -= f.outcome == "returned" and row.attempt > 0
            else:
                row.outcome, row.result, row.error = f.outcome, f.result, f.error

    async def settle(self, key: str, service: str, action: str, order_id: str) -> KeyState:
        row = self.rows.get(key)
        if row is None:
            why = "fenced by a settle before any call claimed it"
            self.rows[key] = _Row(action, order_id, "fenced", error=why)
            return KeyState("fenced", error=why, fenced_now=True)
        if (row.action, row.order_id) != (action, order_id):
            why = f"key {key!r} belongs to {row.action} on order {row.order_id}"
            return KeyState("expired", error=why, landed=row.landed, owner=row.owner,
                            claims=row.claims)  # fmt: skip
        if row.outcome != "pending":
            return self._stored(row)
        if self.atomic:
            row.outcome = "fenced"
            row.error = (f"fenced by a settle: claimed by {row.owner or 'a call'}, never "
                         "finished, so nothing landed")  # fmt: skip
            return KeyState("fenced", error=row.error, owner=row.owner, fenced_now=True,
                            claims=row.claims)  # fmt: skip
        return self._unfinished(row)

    @staticmethod
    def _stored(row: _Row) -> KeyState:
        found: Found = row.outcome  # type: ignore[assignment]
        return KeyState(found, row.result, row.error, row.landed, row.owner, claims=row.claims)

    def _unfinished(self, row: _Row) -> KeyState:
        now = self.clock()
        until = row.lease_until or now
        if until > now:
            return KeyState("running", landed=row.landed, owner=row.owner,
                            lease_s=(until - now).total_seconds(), claims=row.claims)  # fmt: skip
        return KeyState("expired", error=row.error, landed=row.landed, owner=row.owner,
                        lease_s=(now - until).total_seconds(), claims=row.claims)  # fmt: skip

    async def fence(
        self, key: str, service: str, action: str, order_id: str, reason: str,
        claims: int | None = None,
    ) -> KeyState:  # fmt: skip
        row = self.rows.get(key)
        if row is None:
            return await self.settle(key, service, action, order_id)  # nobody claimed it
        expired = (row.lease_until or self.clock()) <= self.clock()
        if row.outcome == "pending" and expired and (claims is None or row.claims <= claims):
            row.outcome, row.error = "fenced", reason
            return KeyState("fenced", error=reason, landed=row.landed, owner=row.owner,
                            fenced_now=True, claims=row.claims)  # fmt: skip
        if row.outcome == "pending":
            return self._unfinished(row)
        return self._stored(row)

    async def record(self, key: str, result: Result) -> None:
        row = self.rows.get(key)
        if row is not None and row.outcome == "pending":
            row.outcome, row.result = "done", result

    def copy(self) -> MemoryKeys:
        """A snapshot (the simulation's crash of a store that keeps nothing unflushed)."""
        twin = MemoryKeys(self.clock, atomic=self.atomic)
        twin.rows = {k: replace(v) for k, v in self.rows.items()}
        return twin


class _Clock(Protocol):
    def __call__(self) -> datetime: ...


def _is_a_store(pg: PgKeys, memory: MemoryKeys) -> tuple[KeyStore, KeyStore]:
    return pg, memory  # mypy checks here that both have the interface
