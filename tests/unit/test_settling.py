"""A service's answer to a settle (``saga_services.settling``), over the in-memory key record: what
it fences, what it asks the system, and how far a person's "did not happen" reaches."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from saga_services.keys import Claiming, MemoryKeys
from saga_services.sdk import KeyQuery, KeyStatus, Service
from saga_services.settling import answer
from saga_shared.model.messages import SettleRequest

KEY, ACTION = "s-1:mail.send", "mail.send"


def request(*, fence: bool = False, claims: int = 0, attempt: int = 1) -> SettleRequest:
    return SettleRequest(saga_id="s-1", order_id="O-1", action=ACTION, step=2,
                         idempotency_key=KEY, attempt=attempt, fence_expired=fence,
                         fence_claims=claims)  # fmt: skip


async def claimed(keys: MemoryKeys, times: int) -> None:
    for _ in range(times):  # each one expired at once: a call that never answered
        await keys.claim("mail", "mail-0#1", [Claiming(KEY, ACTION, "O-1", 1, 5, 0.0)])


def keys() -> MemoryKeys:
    return MemoryKeys(lambda: datetime.now(UTC))


async def test_a_key_nobody_claimed_is_fenced_and_says_so() -> None:
    said = await answer(request(), Service("mail"), store := keys(), None)
    assert (said.verdict, said.claims, said.attempt) == ("fenced", 0, 1)
    assert store.rows[KEY].outcome == "fenced"


async def test_an_expired_claim_without_a_hook_is_in_doubt_and_never_fenced_by_itself() -> None:
    store = keys()
    await claimed(store, 1)
    said = await answer(request(), Service("mail"), store, None)
    assert (said.verdict, said.claims) == ("in_doubt", 1)
    assert "mail has no status hook to ask" in said.reason
    assert store.rows[KEY].outcome == "pending"


async def test_a_person_s_word_fences_the_calls_it_knew_of_and_no_later_one() -> None:
    store = keys()
    await claimed(store, 2)
    refused = await answer(request(fence=True, claims=1), Service("mail"), store, None)
    assert (refused.verdict, refused.claims) == ("in_doubt", 2)
    assert refused.reason.startswith("not fenced: 2 call(s) have claimed the key, 1 when")
    assert store.rows[KEY].outcome == "pending"

    fenced = await answer(request(fence=True, claims=2, attempt=2), Service("mail"), store, None)
    assert (fenced.verdict, fenced.claims) == ("fenced", 2)
    assert store.rows[KEY].outcome == "fenced"


async def test_the_system_s_own_record_decides_an_expired_claim() -> None:
    async def status(query: KeyQuery, deps: Any) -> KeyStatus:
        return KeyStatus("done", result={"email_id": f"em-{query.key}"})

    store = keys()
    await claimed(store, 1)
    said = await answer(request(fence=True, claims=0), Service("mail", status=status), store, None)
    assert (said.verdict, said.result) == ("done", {"email_id": f"em-{KEY}"})
    assert store.rows[KEY].outcome == "done"  # stored: the next settle answers from the record
