"""The in-memory twin of the simulated systems alone (no Postgres): what only it can be asked
(its wiring, its tables, rolling back a failed statement, Postgres's conversions). That it
answers as ``sim_call`` does is ``tests/integration/test_simulated_contract.py``."""

from __future__ import annotations

import asyncio
import itertools
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from pydantic import JsonValue

from saga_services.errors import Permanent, Transient
from saga_services.inventory import system as inventory
from saga_services.keys import Claiming, MemoryKeys, PgKeys
from saga_services.registry import SYSTEMS
from saga_services.sdk import Call, Resources, batch_scope
from saga_services.simulated import Simulated
from saga_services.simulated_memory import MemorySimulated, MemorySystems
from saga_services.simulated_tables import integer, jsonb, jsonb_text, quote_literal, text
from saga_shared.config import Settings

START = datetime(2026, 1, 1, tzinfo=UTC)


def clock_from(start: datetime = START) -> Any:
    ticks = itertools.count()
    return lambda: start + timedelta(seconds=next(ticks))


@pytest.fixture
def systems() -> MemorySystems:
    return MemorySystems(clock_from())


def sim(systems: MemorySystems, system: str) -> MemorySimulated:
    return MemorySimulated(system, systems)


def call(deps: Simulated, action: str, order_id: str = "A-1", key: str | None = None) -> Call[
    None, Simulated
]:  # fmt: skip
    return Call(action=action, params=None, key=key or f"s-{order_id}:{action}", saga_id="s",
                order_id=order_id, phase="forward", attempt=1, send=1,
                deadline=time.monotonic() + 5, deps=deps)  # fmt: skip


RESERVE: dict[str, JsonValue] = {"reservation_id": "res-1", "sku": "SKU-1", "quantity": 2}


# --- wiring --------------------------------------------------------------------------------------


async def test_the_service_yields_the_twin_without_a_pool() -> None:
    keys = MemoryKeys(clock_from(), atomic=True)
    systems = MemorySystems(clock_from())
    resources = Resources(Settings(), None, keys, memory=systems)
    async with SYSTEMS["erp"].open(resources) as deps:
        assert isinstance(deps, MemorySimulated)
        assert deps.system == "erp" and deps.keys is keys and deps.systems is systems
    with pytest.raises(RuntimeError, match="needs the saga database's pool"):
        async with SYSTEMS["erp"].open(Resources(Settings(), None, keys)):
            pass


def test_the_twin_writes_into_a_memory_key_record_only(systems: MemorySystems) -> None:
    assert MemorySimulated("erp", systems).keys is systems.keys
    with pytest.raises(TypeError, match="MemoryKeys"):
        MemorySimulated("erp", systems, PgKeys(None))  # type: ignore[arg-type]


# --- tables --------------------------------------------------------------------------------------


async def test_effects_have_the_shape_of_the_postgres_query(systems: MemorySystems) -> None:
    deps = sim(systems, "inventory")
    assert await deps.apply(call(deps, "inventory.reserve_stock"), RESERVE) == {
        "reservation_id": "res-1"
    }
    released = await deps.apply(call(deps, "inventory.release_stock"), {"reservation_id": "res-1"})

    assert released == {"released": True, "reservation_id": "res-1"}
    effects = systems.effects_for_order("A-1")
    assert effects["reservations"] == [{
        "reservation_id": "res-1", "sku": "SKU-1", "quantity": 2, "status": "released",
        "created_at": START.isoformat(), "released_at": (START + timedelta(seconds=1)).isoformat(),
    }]  # fmt: skip
    assert effects["applied"] == [
        {"action": "inventory.reserve_stock", "idempotency_key": "s-A-1:inventory.reserve_stock",
         "entity_id": "res-1", "times": 1, "first_applied_at": START.isoformat()},
        {"action": "inventory.release_stock", "idempotency_key": "s-A-1:inventory.release_stock",
         "entity_id": "res-1", "times": 1,
         "first_applied_at": (START + timedelta(seconds=1)).isoformat()},
    ]  # fmt: skip
    assert [e.detail for e in systems.effects] == [{"sku": "SKU-1", "quantity": 2}, {}]
    assert [e["entity_id"] for e in systems.effects] == ["res-1", "res-1"]
    assert systems.effects_for_order("B-2") == {
        "reservations": [], "credit_notes": [], "charges": [], "emails": [], "applied": []
    }  # fmt: skip


async def test_a_stored_result_is_handed_out_as_a_copy(systems: MemorySystems) -> None:
    deps = sim(systems, "erp")
    c = call(deps, "erp.validate_address")
    first = await deps.apply(c, {"valid": True, "address": "1 Main Street"})
    first["valid"] = False

    assert await deps.apply(c, {}) == {"valid": True, "address": "1 Main Street"}


async def test_the_calls_of_a_batch_share_one_statement_time(systems: MemorySystems) -> None:
    deps = sim(systems, "email")
    values: list[dict[str, JsonValue]] = [
        {"email_id": f"em-{i}", "recipient": "a@b.c", "template": "t"} for i in range(3)
    ]
    async with batch_scope():
        await asyncio.gather(*(deps.apply(call(deps, "email.send_confirmation", key=f"k{i}"), v)
                               for i, v in enumerate(values)))  # fmt: skip

    assert {r["sent_at"] for r in systems.effects_for_order("A-1")["emails"]} == {START.isoformat()}
    assert [e.id for e in systems.effects] == [1, 2, 3]


# --- a failed statement leaves nothing -----------------------------------------------------------


async def test_a_duplicate_id_fails_the_whole_batch_and_keeps_none_of_it(
    systems: MemorySystems,
) -> None:
    deps = sim(systems, "inventory")
    async with batch_scope():
        answers = await asyncio.gather(
            deps.apply(call(deps, "inventory.reserve_stock", key="k1"), RESERVE),
            deps.apply(call(deps, "inventory.reserve_stock", key="k2"), RESERVE),
            return_exceptions=True,
        )

    assert all(isinstance(a, asyncpg.UniqueViolationError) for a in answers)
    assert "sim_inventory_reservations_pkey" in str(answers[0])
    assert systems.reservations == {} and systems.effects == [] and systems.keys.rows == {}
    assert await deps.apply(call(deps, "inventory.reserve_stock", key="k2"), RESERVE)


async def test_a_refusal_half_way_keeps_the_claim_and_none_of_the_action(
    systems: MemorySystems,
) -> None:
    deps = sim(systems, "inventory")
    await deps.apply(call(deps, "inventory.reserve_stock", order_id="A-1"), RESERVE)
    release = call(deps, "inventory.release_stock", order_id="B-2")
    with pytest.raises(Permanent, match="res-1 belongs to order A-1, not B-2"):
        await deps.apply(release, {"reservation_id": "res-1"})

    assert systems.reservations["res-1"].status == "reserved"
    assert systems.keys.rows[release.key].outcome == "failed"


async def test_a_nul_is_refused_before_anything_runs(systems: MemorySystems) -> None:
    deps = sim(systems, "email")
    bad: dict[str, JsonValue] = {"email_id": "em-1", "recipient": "a\x00@b.c", "template": "t"}
    with pytest.raises(asyncpg.UntranslatableCharacterError):
        await deps.apply(call(deps, "email.send_confirmation"), bad)
    with pytest.raises(asyncpg.CharacterNotInRepertoireError):
        await deps.refuse(call(deps, "email.send_confirmation", order_id="A\x00"), "no")

    assert systems.keys.rows == {} and systems.emails == {}


async def test_a_missing_value_is_a_not_null_violation(systems: MemorySystems) -> None:
    deps = sim(systems, "payments")
    with pytest.raises(asyncpg.NotNullViolationError, match='"card_token"'):
        await deps.apply(call(deps, "payments.charge_card"), {"payment_id": "p", "amount_cents": 1})
    assert systems.keys.rows == {}


# --- faults --------------------------------------------------------------------------------------


def test_faults_are_checked_listed_and_cleared(systems: MemorySystems) -> None:
    systems.add_fault("erp.void_credit_note", "B-2", "hang")
    systems.add_fault("email.send_confirmation", "A-1", "transient:3")
    systems.add_fault("erp.create_credit_note", "A-1", "permanent")
    systems.add_fault("erp.create_credit_note", "A-1", "hang:2")  # replaces the one before
    for action, order, mode in [("erp.create_credit_note", "A-1", "transient"),
                                ("erp.teleport", "A-1", "permanent"),
                                ("erp.create_credit_note", "", "permanent")]:  # fmt: skip
        with pytest.raises(ValueError):
            systems.add_fault(action, order, mode)

    listed = [(f["order_id"], f["action"], f["mode"], f["remaining"])
              for f in systems.list_faults()]  # fmt: skip
    assert listed == [
        ("A-1", "email.send_confirmation", "transient", 3),
        ("A-1", "erp.create_credit_note", "hang", 2),
        ("B-2", "erp.void_credit_note", "hang", None),
    ]
    assert isinstance(systems.list_faults()[0]["created_at"], str)
    assert systems.clear_faults("A-1") == 2
    assert systems.clear_faults() == 1
    assert systems.list_faults() == []


async def test_a_transient_fault_leaves_the_claim_unfinished(systems: MemorySystems) -> None:
    systems.add_fault("erp.create_credit_note", "A-1", "transient:1")
    deps = sim(systems, "erp")
    note = call(deps, "erp.create_credit_note")
    with pytest.raises(Transient, match=r"\(0 more to come\)"):
        await deps.apply(note, {"credit_note_id": "cn-1", "amount_cents": 5})
    assert systems.keys.rows[note.key].outcome == "pending" and systems.credit_notes == {}

    assert await deps.apply(note, {"credit_note_id": "cn-1", "amount_cents": 5})
    assert systems.keys.rows[note.key].outcome == "done"


async def test_a_hang_never_answers(systems: MemorySystems) -> None:
    systems.add_fault("inventory.reserve_stock", "A-1", "hang")
    deps = sim(systems, "inventory")
    reserve = call(deps, "inventory.reserve_stock")
    for _ in range(2):
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(deps.apply(reserve, RESERVE), 0.05)

    assert systems.keys.rows[reserve.key].outcome == "pending"
    assert systems.reservations == {} and systems.faults[reserve.action, "A-1"].remaining is None


# --- fences --------------------------------------------------------------------------------------


async def test_a_compensation_fences_a_claim_left_unfinished(systems: MemorySystems) -> None:
    keys = MemoryKeys(clock_from(), atomic=True)
    deps = MemorySimulated("payments", systems, keys)
    claim = Claiming("s-A-1:payments.charge_card", "payments.charge_card", "A-1", 1, 3, 30.0)
    [ticket] = await keys.claim("payments", "adapter-1", [claim])
    assert ticket.kind == "call"

    refund = call(deps, "payments.refund_charge")
    answer = await deps.apply(refund, {"forward_key": claim.key, "refund_id": "re-1"})

    assert answer == {"refunded": False, "payment_id": None, "refund_id": None}
    fenced = keys.rows[claim.key]
    assert (fenced.outcome, fenced.owner) == ("fenced", "adapter-1")
    assert fenced.error == f"not run: payments.refund_charge ({refund.key}) compensated it first"
    with pytest.raises(Permanent, match="compensated it first"):
        await deps.apply(call(deps, "payments.charge_card"), {"payment_id": "p", "amount_cents": 1,
                                                              "card_token": "tok"})  # fmt: skip
    assert systems.charges == {} and systems.keys.rows == {}  # its own record only


# --- Postgres's conversions ----------------------------------------------------------------------


def test_integer_reads_text_as_int4_does() -> None:
    assert integer(" +12\n") == 12
    assert integer("-2147483648") == -(2**31)
    assert integer(None) is None
    syntax = "invalid input syntax"
    for bad, why in [("2147483648", "out of range"), ("1_000", syntax), ("2.5", syntax),
                     ("0x10", syntax)]:  # fmt: skip
        with pytest.raises(Exception, match=why):
            integer(bad)


def test_values_read_and_print_as_jsonb_does() -> None:
    v: dict[str, JsonValue] = {"s": "x", "n": 5, "b": True, "o": {"bb": 1, "a": [1, 2.5]}}
    assert [text(v, f) for f in ("s", "n", "b", "o", "missing")] == [
        "x", "5", "true", '{"a": [1, 2.5], "bb": 1}', None,
    ]  # fmt: skip
    assert jsonb({"big": 1e20, "one": 1.0, "small": 1e-7}) == {
        "big": 10**20, "one": 1.0, "small": 1e-7,
    }  # fmt: skip
    assert jsonb_text(-0.0) == "0.0"
    with pytest.raises(asyncpg.InvalidTextRepresentationError):
        jsonb({"x": float("nan")})


def test_quote_literal() -> None:
    assert quote_literal("k1") == "'k1'"
    assert quote_literal("it's") == "'it''s'"
    assert quote_literal("a\\b") == "E'a\\\\b'"


# --- determinism ---------------------------------------------------------------------------------


async def test_the_same_calls_leave_the_same_state(monkeypatch: pytest.MonkeyPatch) -> None:
    async def run() -> dict[str, Any]:
        ids = itertools.count(1)
        monkeypatch.setattr(inventory, "new_id", lambda prefix: f"{prefix}-{next(ids)}")
        systems = MemorySystems(clock_from())
        deps: Simulated = sim(systems, "inventory")
        params = inventory.Reserve(sku="S", quantity=1)
        for order in ("A-1", "B-2"):
            c = Call(action="inventory.reserve_stock", params=params, key=f"s-{order}",
                     saga_id="s", order_id=order, phase="forward", attempt=1, send=1,
                     deadline=time.monotonic() + 5, deps=deps)  # fmt: skip
            await inventory.reserve_stock(c)
        return {o: systems.effects_for_order(o) for o in ("A-1", "B-2")}

    first = await run()
    assert first == await run()
    assert first["B-2"]["reservations"][0]["reservation_id"] == "res-2"
