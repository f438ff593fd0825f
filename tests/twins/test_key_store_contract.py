"""The services' key record held to one contract: ``PgKeys`` (``service_keys`` and its
functions, migration 0012) and ``MemoryKeys`` (the test kit, the simulation), each for a system
whose effect commits with the key's row (``atomic``) and for one that does not. Every test runs
on all four and asserts what the adapter SDK relies on: a claim counts attempts, an unfinished
claim of another process is in doubt, a settle fences what nobody claimed, nothing is ever
claimed over a fence."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import asyncpg
import pytest

from saga_services.keys import Claiming, Finished, KeyStore, MemoryKeys, PgKeys, Ticket

SERVICE, ACTION, OTHER = "contract", "contract.send", "contract.other"
LIVE_S = 60.0  # a lease that outlives any test
A, B = "contract-0#1", "contract-1#1"


@pytest.fixture(
    params=[
        pytest.param("postgres_keys", id="postgres", marks=pytest.mark.integration),
        pytest.param("memory_keys", id="memory"),  # no Postgres: the fast tier runs it
    ]
)
def keys(request: pytest.FixtureRequest, atomic: bool) -> KeyStore:
    # Only the chosen implementation's fixture is set up, so the memory half needs no database;
    # ``atomic`` is named here so that both are run with each of its values.
    chosen: KeyStore = request.getfixturevalue(request.param)
    return chosen


@pytest.fixture(params=[True, False], ids=["atomic", "not-atomic"])
def atomic(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


@pytest.fixture
def memory_keys(atomic: bool) -> KeyStore:
    return MemoryKeys(lambda: datetime.now(UTC), atomic=atomic)


@pytest.fixture
async def postgres_keys(atomic: bool, pool: asyncpg.Pool) -> AsyncIterator[KeyStore]:
    yield PgKeys(pool, atomic=atomic)
    await pool.execute("DELETE FROM service_keys WHERE system = $1", SERVICE)


@pytest.fixture
def key() -> str:
    return f"contract-{uuid.uuid4().hex}"


def claiming(key: str, *, send: int = 1, limit: int = 3, lease_s: float = LIVE_S,
             action: str = ACTION, order_id: str = "O-1") -> Claiming:  # fmt: skip
    return Claiming(key, action, order_id, send, limit, lease_s)


async def claim(keys: KeyStore, owner: str, c: Claiming) -> Ticket:
    [ticket] = await keys.claim(SERVICE, owner, [c])
    return ticket


async def test_the_first_claim_calls_and_its_outcome_answers_every_later_one(
    keys: KeyStore, key: str
) -> None:
    first = await claim(keys, A, claiming(key))
    assert (first.kind, first.attempt, first.owner) == ("call", 1, A)
    await keys.finish(A, [Finished(key, "done", {"id": "x-1"})])

    again = await claim(keys, B, claiming(key))
    assert (again.kind, again.result) == ("done", {"id": "x-1"})
    state = await keys.settle(key, SERVICE, ACTION, "O-1")
    assert (state.found, state.result, state.fenced_now) == ("done", {"id": "x-1"}, False)


async def test_a_batch_is_one_claim_with_a_ticket_per_key_in_order(
    keys: KeyStore, key: str
) -> None:
    await keys.finish(A, [])  # nothing to store: no statement, no error
    await claim(keys, A, claiming(key))
    await keys.finish(A, [Finished(key, "failed", error="refused by the system")])
    fresh = f"{key}-2"
    tickets = await keys.claim(SERVICE, A, [claiming(fresh), claiming(key)])
    assert [(t.kind, t.attempt) for t in tickets] == [("call", 1), ("failed", 1)]
    assert tickets[1].error == "refused by the system"


async def test_each_claim_of_a_send_counts_an_attempt_up_to_the_limit(
    keys: KeyStore, key: str
) -> None:
    tries = [await claim(keys, A, claiming(key, limit=3)) for _ in range(4)]
    assert [(t.kind, t.attempt) for t in tries] == [("call", 1), ("call", 2), ("call", 3),
                                                    ("spent", 3)]  # fmt: skip
    resent = await claim(keys, A, claiming(key, send=2, limit=3))
    assert (resent.kind, resent.attempt) == ("call", 1)  # a new send has its own attempts
    stale = await claim(keys, A, claiming(key, send=1, limit=3))
    assert stale.kind == "spent"  # an older send never calls after a newer one


async def test_an_unfinished_claim_of_another_process_is_not_called_again_unless_atomic(
    keys: KeyStore, key: str, atomic: bool
) -> None:
    await claim(keys, A, claiming(key))
    other = await claim(keys, B, claiming(key))
    if atomic:  # nothing landed unless the row says so: B takes the claim over
        assert (other.kind, other.attempt, other.owner) == ("call", 2, B)
    else:
        assert (other.kind, other.owner) == ("busy", A)
        assert other.lease_s is not None and LIVE_S - 10 < other.lease_s <= LIVE_S


async def test_a_settle_fences_a_key_nobody_claimed_and_no_claim_passes_a_fence(
    keys: KeyStore, key: str
) -> None:
    state = await keys.settle(key, SERVICE, ACTION, "O-1")
    assert (state.found, state.fenced_now) == ("fenced", True)
    refused = await claim(keys, A, claiming(key))
    assert refused.kind == "fenced"
    assert "fenced by a settle" in (refused.error or "")
    again = await keys.settle(key, SERVICE, ACTION, "O-1")
    assert (again.found, again.fenced_now) == ("fenced", False)
    await keys.finish(A, [Finished(key, "done", {"id": "late"})])  # never over a fence
    assert (await keys.settle(key, SERVICE, ACTION, "O-1")).found == "fenced"


async def test_a_settle_of_a_live_claim(keys: KeyStore, key: str, atomic: bool) -> None:
    await claim(keys, A, claiming(key))
    state = await keys.settle(key, SERVICE, ACTION, "O-1")
    if atomic:  # unfinished, so nothing landed: fenced at once, and the claim is refused
        assert (state.found, state.fenced_now, state.owner) == ("fenced", True, A)
        assert (await claim(keys, A, claiming(key))).kind == "fenced"
        return
    assert (state.found, state.owner, state.fenced_now) == ("running", A, False)
    assert state.lease_s is not None and LIVE_S - 10 < state.lease_s <= LIVE_S
    # a live lease is never fenced: its call may be landing now
    fenced = await keys.fence(key, SERVICE, ACTION, "O-1", "a person said it did not happen")
    assert (fenced.found, fenced.fenced_now) == ("running", False)


async def test_an_expired_claim_is_fenced_only_when_asked(
    keys: KeyStore, key: str, atomic: bool
) -> None:
    await claim(keys, A, claiming(key, lease_s=0.0))
    if not atomic:
        state = await keys.settle(key, SERVICE, ACTION, "O-1")
        assert (state.found, state.owner, state.fenced_now) == ("expired", A, False)
    fenced = await keys.fence(key, SERVICE, ACTION, "O-1", "a person said it did not happen")
    assert fenced.found == "fenced"
    assert (await claim(keys, B, claiming(key))).kind == "fenced"
    await keys.finish(A, [Finished(key, "done", {"id": "late"})])  # the old owner, too late
    assert (await keys.settle(key, SERVICE, ACTION, "O-1")).found == "fenced"


async def test_a_fence_at_a_person_s_word_covers_only_the_calls_they_knew_of(
    keys: KeyStore, key: str, atomic: bool
) -> None:
    """A person said it did not happen when one call had claimed the key; a second call
    claimed it since (its request was queued behind): that one is not fenced on their word."""
    await claim(keys, A, claiming(key, lease_s=0.0))
    state = await keys.settle(key, SERVICE, ACTION, "O-1")
    if atomic:
        assert (state.found, state.claims) == ("fenced", 1)
        return  # an unfinished claim of an atomic system is fenced at once: nothing to bound
    assert (state.found, state.claims) == ("expired", 1)
    await claim(keys, A, claiming(key, lease_s=0.0))  # expired too: fenceable but for the bound
    said = "a person said it did not happen"
    kept = await keys.fence(key, SERVICE, ACTION, "O-1", said, claims=1)
    assert (kept.found, kept.claims, kept.fenced_now) == ("expired", 2, False)
    fenced = await keys.fence(key, SERVICE, ACTION, "O-1", said, claims=2)
    assert (fenced.found, fenced.claims, fenced.fenced_now) == ("fenced", 2, True)


async def test_a_released_claim_may_have_landed_and_a_returned_one_gives_its_try_back(
    keys: KeyStore, key: str, atomic: bool
) -> None:
    await claim(keys, A, claiming(key, limit=2))
    await keys.finish(A, [Finished(key, "released", error="timed out", landed=True)])
    if not atomic:
        state = await keys.settle(key, SERVICE, ACTION, "O-1")
        assert (state.found, state.landed) == ("expired", True)  # its lease ended with it
    second = await claim(keys, A, claiming(key, limit=2))
    assert (second.kind, second.attempt, second.landed) == ("call", 2, True)
    await keys.finish(A, [Finished(key, "returned", error="the function broke")])
    third = await claim(keys, A, claiming(key, limit=2))
    assert (third.kind, third.attempt) == ("call", 2)  # the broken try did not count


async def test_a_key_of_another_action_or_order_is_refused(keys: KeyStore, key: str) -> None:
    await claim(keys, A, claiming(key))
    for c in (claiming(key, action=OTHER), claiming(key, order_id="O-2")):
        refused = await claim(keys, A, c)
        assert refused.kind == "failed"
        assert f"was first used for {ACTION} on order O-1" in (refused.error or "")
    state = await keys.settle(key, SERVICE, OTHER, "O-1")
    assert state.found == "expired" and f"belongs to {ACTION}" in (state.error or "")


async def test_only_the_owner_finishes_and_a_status_hook_s_word_is_stored(
    keys: KeyStore, key: str
) -> None:
    await claim(keys, A, claiming(key))
    await keys.finish(B, [Finished(key, "failed", error="not B's claim")])  # ignored
    again = await claim(keys, A, claiming(key))
    assert (again.kind, again.attempt) == ("call", 2)
    await keys.record(key, {"id": "from-status"})
    state = await keys.settle(key, SERVICE, ACTION, "O-1")
    assert (state.found, state.result) == ("done", {"id": "from-status"})
