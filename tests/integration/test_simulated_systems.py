"""The simulated systems against the real Postgres: idempotency, faults, compensations."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Literal

import asyncpg
import pytest
from pydantic import JsonValue

from saga_app.output import plain_table
from saga_services.effects import effect_tables, effects_for_order
from saga_services.errors import Permanent, Transient
from saga_services.faults import add_fault, clear_faults, list_faults, parse_mode
from saga_services.registry import SYSTEMS
from saga_services.simulated import Simulated
from saga_shared.model.messages import ActionRequest, Phase


def request(
    order_id: str,
    action: str,
    params: dict[str, JsonValue],
    *,
    key: str | None = None,
    phase: Phase = "forward",
) -> ActionRequest:
    saga_id = f"saga-{order_id}"
    return ActionRequest(
        saga_id=saga_id,
        order_id=order_id,
        action=action,
        phase=phase,
        step=0,
        idempotency_key=key or f"{saga_id}:{action}",
        params=params,
        timeout_s=5,
    )


@dataclass(frozen=True)
class Stored:
    """What the system answered for one call (a transient fault is raised)."""

    outcome: Literal["done", "failed"]
    result: dict[str, JsonValue] | None = None
    error: str | None = None

    @classmethod
    def done(cls, result: dict[str, JsonValue]) -> Stored:
        return cls("done", result)

    @classmethod
    def failed(cls, error: str) -> Stored:
        return cls("failed", error=error)


async def execute(pool: asyncpg.Pool, req: ActionRequest) -> Stored:
    """One call of the built-in service's function, as its adapter makes it."""
    service = SYSTEMS[req.action.split(".")[0]]
    try:
        return Stored.done(await service.call(req, Simulated(service.name, pool.acquire)))
    except Permanent as exc:
        return Stored.failed(str(exc))


async def applied(pool: asyncpg.Pool, order_id: str) -> list[dict[str, Any]]:
    return (await effects_for_order(pool, order_id))["applied"]


RESERVE: dict[str, JsonValue] = {"sku": "SKU-1", "quantity": 2}


# --- idempotency ---------------------------------------------------------------------------------


async def test_same_key_twice_applies_once(pool: asyncpg.Pool, order_id: str) -> None:
    req = request(order_id, "inventory.reserve_stock", RESERVE)
    first = await execute(pool, req)
    second = await execute(pool, req)

    assert first.outcome == "done"
    assert first.result is not None
    assert str(first.result["reservation_id"]).startswith("res-")
    assert second == first
    effects = await effects_for_order(pool, order_id)
    assert len(effects["reservations"]) == 1
    assert effects["reservations"][0]["status"] == "reserved"
    assert [(e["action"], e["times"]) for e in effects["applied"]] == [
        ("inventory.reserve_stock", 1)
    ]


async def test_stored_permanent_failure_is_returned_for_the_retry(
    pool: asyncpg.Pool, order_id: str
) -> None:
    bad = request(order_id, "inventory.reserve_stock", {"sku": "SKU-1", "quantity": 0})
    first = await execute(pool, bad)
    # Same key, now valid parameters: Stripe returns the first answer, and so do we.
    retry = await execute(pool, bad.model_copy(update={"params": RESERVE}))

    assert first.outcome == "failed"
    assert first.error is not None
    assert "quantity must be positive" in first.error
    assert retry == first
    assert (await effects_for_order(pool, order_id))["reservations"] == []


async def test_injected_permanent_fault_is_stored(pool: asyncpg.Pool, order_id: str) -> None:
    await add_fault(pool, "erp.create_credit_note", order_id, "permanent")
    req = request(order_id, "erp.create_credit_note", {"amount_cents": 500})
    first = await execute(pool, req)
    await clear_faults(pool, order_id)
    retry = await execute(pool, req)

    assert first == Stored.failed("injected permanent fault on erp.create_credit_note")
    assert retry == first
    assert await applied(pool, order_id) == []


async def test_transient_fault_fails_n_times_then_succeeds(
    pool: asyncpg.Pool, order_id: str
) -> None:
    await add_fault(pool, "inventory.reserve_stock", order_id, "transient:2")
    req = request(order_id, "inventory.reserve_stock", RESERVE)
    for _ in range(2):
        with pytest.raises(Transient, match="injected transient fault"):
            await execute(pool, req)
    result = await execute(pool, req)

    assert result.outcome == "done"
    assert [e["times"] for e in await applied(pool, order_id)] == [1]
    faults = [f for f in await list_faults(pool) if f["order_id"] == order_id]
    assert [(f["mode"], f["remaining"]) for f in faults] == [("transient", 0)]


async def test_a_hang_never_answers_keeps_nothing_then_the_call_runs_for_real(
    pool: asyncpg.Pool, order_id: str
) -> None:
    await add_fault(pool, "inventory.reserve_stock", order_id, "hang:1")
    req = request(order_id, "inventory.reserve_stock", RESERVE)
    with pytest.raises(TimeoutError):  # what the adapter's timeout does to it
        await asyncio.wait_for(execute(pool, req), 0.5)
    assert await applied(pool, order_id) == []
    result = await execute(pool, req)  # the same key: nothing was kept, so it runs now

    assert result.outcome == "done"
    assert [e["times"] for e in await applied(pool, order_id)] == [1]
    await add_fault(pool, "inventory.reserve_stock", order_id, "hang")
    for _ in range(2):  # "hang" alone: every call
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(execute(pool, request(order_id, "inventory.reserve_stock",
                                                         RESERVE, key="other")), 0.3)  # fmt: skip


async def test_concurrent_calls_with_one_key_apply_once(pool: asyncpg.Pool, order_id: str) -> None:
    req = request(order_id, "payments.charge_card", {"amount_cents": 1200, "card_token": "tok_1"})
    results = await asyncio.gather(*(execute(pool, req) for _ in range(5)))

    assert all(r == results[0] for r in results)
    assert results[0].outcome == "done"
    effects = await effects_for_order(pool, order_id)
    assert len(effects["charges"]) == 1
    assert [e["times"] for e in effects["applied"]] == [1]


async def test_key_reused_for_another_action_is_refused(pool: asyncpg.Pool, order_id: str) -> None:
    await execute(pool, request(order_id, "inventory.reserve_stock", RESERVE, key=f"{order_id}:k1"))
    other = await execute(
        pool, request(order_id, "erp.create_credit_note", {"amount_cents": 1}, key=f"{order_id}:k1")
    )

    assert other.outcome == "failed"
    assert other.error is not None
    assert "first used for inventory.reserve_stock" in other.error


async def test_unknown_action_fails_permanently(pool: asyncpg.Pool, order_id: str) -> None:
    result = await execute(pool, request(order_id, "inventory.teleport_stock", {}))

    assert result.outcome == "failed"
    assert result.error is not None
    assert "has no function for 'inventory.teleport_stock'" in result.error


# --- compensations -------------------------------------------------------------------------------

# (forward action, its params, compensation, id field, "undone" flag)
COMPENSABLE = [
    ("inventory.reserve_stock", RESERVE, "inventory.release_stock", "reservation_id", "released"),
    ("erp.create_credit_note", {"amount_cents": 700}, "erp.void_credit_note", "credit_note_id",
     "voided"),
    ("payments.charge_card", {"amount_cents": 900, "card_token": "tok_visa"},
     "payments.refund_charge", "payment_id", "refunded"),
]  # fmt: skip


@pytest.mark.parametrize(("forward", "params", "comp", "id_field", "flag"), COMPENSABLE)
@pytest.mark.parametrize("by", ["id", "forward_key"])
async def test_compensation_undoes_once(
    pool: asyncpg.Pool,
    order_id: str,
    forward: str,
    params: dict[str, JsonValue],
    comp: str,
    id_field: str,
    flag: str,
    by: str,
) -> None:
    fwd = request(order_id, forward, params)
    done = await execute(pool, fwd)
    assert done.result is not None
    entity = done.result[id_field]
    comp_params: dict[str, JsonValue] = {"forward_key": fwd.idempotency_key}
    if by == "id":
        comp_params[id_field] = entity

    undo = request(order_id, comp, comp_params, phase="compensation")
    first = await execute(pool, undo)
    same_key = await execute(pool, undo)
    # A resumed saga may compensate again under another key: the target is already undone.
    again = await execute(
        pool, undo.model_copy(update={"idempotency_key": undo.idempotency_key + ":again"})
    )

    assert first.outcome == "done"
    assert first.result is not None
    assert first.result[flag] is True
    assert first.result[id_field] == entity
    assert same_key == first
    assert again.outcome == "done"
    assert again.result is not None
    assert again.result[flag] is False
    times = {e["action"]: e["times"] for e in await applied(pool, order_id)}
    assert times == {forward: 1, comp: 1}


async def test_refund_records_the_refund(pool: asyncpg.Pool, order_id: str) -> None:
    fwd = request(order_id, "payments.charge_card", {"amount_cents": 900, "card_token": "tok_x"})
    await execute(pool, fwd)
    undo = request(
        order_id,
        "payments.refund_charge",
        {"forward_key": fwd.idempotency_key},
        phase="compensation",
    )
    result = await execute(pool, undo)

    assert result.result is not None
    charge = (await effects_for_order(pool, order_id))["charges"][0]
    assert charge["status"] == "refunded"
    assert charge["refund_id"] == result.result["refund_id"]
    assert str(charge["refund_id"]).startswith("re-")
    assert isinstance(charge["refunded_at"], str)  # ISO text, ready for JSON


@pytest.mark.parametrize(("forward", "params", "comp", "id_field", "flag"), COMPENSABLE)
async def test_compensating_what_never_landed_is_a_no_op_and_fences_it(
    pool: asyncpg.Pool,
    order_id: str,
    forward: str,
    params: dict[str, JsonValue],
    comp: str,
    id_field: str,
    flag: str,
) -> None:
    fwd = request(order_id, forward, params)
    undo = request(order_id, comp, {"forward_key": fwd.idempotency_key}, phase="compensation")
    result = await execute(pool, undo)
    # The forward request arriving late (redelivered after a timeout) must not land now.
    late = await execute(pool, fwd)

    assert result.outcome == "done"
    assert result.result is not None
    assert result.result[flag] is False
    assert result.result[id_field] is None
    assert late.outcome == "failed"
    assert late.error is not None
    assert "compensated it first" in late.error
    assert await applied(pool, order_id) == []


async def test_compensating_a_refused_forward_is_a_no_op(pool: asyncpg.Pool, order_id: str) -> None:
    fwd = request(order_id, "inventory.reserve_stock", {"sku": "S", "quantity": -1})
    assert (await execute(pool, fwd)).outcome == "failed"
    undo = request(
        order_id,
        "inventory.release_stock",
        {"forward_key": fwd.idempotency_key},
        phase="compensation",
    )
    result = await execute(pool, undo)

    assert result == Stored.done({"released": False, "reservation_id": None})


async def test_compensating_an_unknown_id_is_a_no_op(pool: asyncpg.Pool, order_id: str) -> None:
    undo = request(
        order_id, "erp.void_credit_note", {"credit_note_id": "cn-missing"}, phase="compensation"
    )
    result = await execute(pool, undo)

    assert result == Stored.done({"voided": False, "credit_note_id": "cn-missing"})


async def test_compensation_refuses_another_orders_entity(
    pool: asyncpg.Pool, order_id: str
) -> None:
    done = await execute(pool, request(order_id, "inventory.reserve_stock", RESERVE))
    assert done.result is not None
    other = f"{order_id}-other"
    undo = request(
        other, "inventory.release_stock", {"reservation_id": done.result["reservation_id"]},
        phase="compensation",
    )  # fmt: skip
    result = await execute(pool, undo)

    assert result.outcome == "failed"
    assert result.error is not None
    assert f"belongs to order {order_id}" in result.error
    assert (await effects_for_order(pool, order_id))["reservations"][0]["status"] == "reserved"


async def test_compensation_without_target_is_refused(pool: asyncpg.Pool, order_id: str) -> None:
    undo = request(order_id, "inventory.release_stock", {}, phase="compensation")
    result = await execute(pool, undo)

    assert result.outcome == "failed"
    assert result.error is not None
    assert "'reservation_id' or 'forward_key'" in result.error


async def test_injected_fault_on_a_compensation(pool: asyncpg.Pool, order_id: str) -> None:
    fwd = request(order_id, "inventory.reserve_stock", RESERVE)
    await execute(pool, fwd)
    await add_fault(pool, "inventory.release_stock", order_id, "permanent")
    undo = request(
        order_id,
        "inventory.release_stock",
        {"forward_key": fwd.idempotency_key},
        phase="compensation",
    )
    result = await execute(pool, undo)

    assert result.outcome == "failed"
    assert (await effects_for_order(pool, order_id))["reservations"][0]["status"] == "reserved"


# --- the other actions ---------------------------------------------------------------------------


async def test_validate_address(pool: asyncpg.Pool, order_id: str) -> None:
    ok = await execute(
        pool, request(order_id, "erp.validate_address", {"address": "  1 Main   St \n Springfield"})
    )
    closed = await execute(
        pool,
        request(
            order_id,
            "erp.validate_address",
            {"address": "Depot CLOSED, Elm St"},
            key=f"{order_id}:k2",
        ),
    )

    assert ok == Stored.done({"valid": True, "address": "1 Main St Springfield"})
    assert closed.outcome == "failed"
    assert closed.error == "address 'Depot CLOSED, Elm St' is a closed depot"
    assert await applied(pool, order_id) == []  # read only


@pytest.mark.parametrize("action", ["email.send_customer_email", "email.send_confirmation"])
async def test_email_uses_the_action_as_template(
    pool: asyncpg.Pool, order_id: str, action: str
) -> None:
    result = await execute(pool, request(order_id, action, {"customer_email": "ann@example.com"}))

    assert result.result is not None
    assert str(result.result["email_id"]).startswith("em-")
    emails = (await effects_for_order(pool, order_id))["emails"]
    assert [(e["recipient"], e["template"]) for e in emails] == [
        ("ann@example.com", action.split(".")[1])
    ]


async def test_declined_card_and_bad_params_fail_permanently(
    pool: asyncpg.Pool, order_id: str
) -> None:
    declined = await execute(
        pool,
        request(
            order_id, "payments.charge_card", {"amount_cents": 5, "card_token": "tok_declined"}
        ),
    )
    wrong_type = await execute(
        pool, request(order_id, "inventory.reserve_stock", {"sku": "S", "quantity": "2"})
    )

    assert declined == Stored.failed("card tok_declined was declined")
    assert wrong_type.error == (
        "inventory.reserve_stock: invalid parameters: quantity: Input should be a valid integer"
    )


# --- faults and effects listing ------------------------------------------------------------------


async def test_faults_add_list_clear(pool: asyncpg.Pool, order_id: str) -> None:
    other = f"{order_id}-b"
    await add_fault(pool, "inventory.reserve_stock", order_id, "transient:3")
    await add_fault(pool, "inventory.reserve_stock", order_id, "permanent")  # replaces
    await add_fault(pool, "payments.refund_charge", order_id, "transient:1")
    await add_fault(pool, "erp.create_credit_note", other, "permanent")

    mine = [f for f in await list_faults(pool) if f["order_id"] == order_id]
    assert [(f["action"], f["mode"], f["remaining"]) for f in mine] == [
        ("inventory.reserve_stock", "permanent", None),
        ("payments.refund_charge", "transient", 1),
    ]
    assert isinstance(mine[0]["created_at"], str)
    assert await clear_faults(pool, order_id) == 2
    assert await clear_faults(pool, order_id) == 0
    assert await clear_faults(pool, None) >= 1
    assert [f for f in await list_faults(pool) if f["order_id"] in (order_id, other)] == []


async def test_add_fault_refuses_unknown_action(pool: asyncpg.Pool, order_id: str) -> None:
    with pytest.raises(ValueError, match=r"unknown action 'inventory\.nope'"):
        await add_fault(pool, "inventory.nope", order_id, "permanent")


@pytest.mark.parametrize(
    ("text", "expected"),
    [("permanent", ("permanent", None)), ("transient:1", ("transient", 1)),
     ("transient:1000", ("transient", 1000)), ("hang", ("hang", None)), ("hang:3", ("hang", 3))],
)  # fmt: skip
def test_parse_mode(text: str, expected: tuple[str, int | None]) -> None:
    assert parse_mode(text) == expected


@pytest.mark.parametrize(
    "text",
    ["", "perm", "permanent:2", "transient", "transient:", "transient:0", "transient:1001",
     "transient:x", "transient:-1", "timeout", "hang:", "hang:0", "hang:1001", "hanging"],
)  # fmt: skip
def test_parse_mode_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="fault mode"):
        parse_mode(text)


async def test_effect_tables(pool: asyncpg.Pool, order_id: str) -> None:
    await execute(pool, request(order_id, "inventory.reserve_stock", RESERVE))
    tables = effect_tables(await effects_for_order(pool, order_id))
    text = "\n\n".join(plain_table(h, rows, title=title) for title, h, rows in tables)

    assert "reservations (1)" in text
    assert "SKU-1" in text
    assert "credit_notes (0)\n  (none)" in text
    assert "inventory.reserve_stock" in text.split("applied (1)")[1]
