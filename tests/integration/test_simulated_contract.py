"""The simulated systems over Postgres (``sim_call``) and their in-memory twin
(``saga_services.simulated_memory``) held to one contract: the same sequences of calls, through the
real functions of the four services, give the same answers, the same effects per order, the same
key rows and the same faults left. Ids are made identical by a counter in place of the
systems' ``new_id``; timestamps are compared as set or not (each side has its own clock)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any, ParamSpec, TypeVar

import asyncpg
import pytest
from pydantic import JsonValue

from saga_services import faults
from saga_services.effects import effects_for_order
from saga_services.email import system as email
from saga_services.erp import system as erp
from saga_services.errors import Permanent, Transient
from saga_services.inventory import system as inventory
from saga_services.keys import Claiming, KeyStore, MemoryKeys, PgKeys, Ticket
from saga_services.payments import system as payments
from saga_services.registry import SYSTEMS
from saga_services.sdk import Call, Resources, batch_scope
from saga_services.simulated_memory import MemorySimulated, MemorySystems
from saga_services.simulated_tables import jsonb_text
from saga_shared.config import Settings
from saga_shared.model.messages import ActionRequest, Phase

Rows = list[dict[str, object]]
Answer = tuple[str, Any]  # ("done", result) | ("failed" | "transient", text) | ("timeout", None)
Scenario = Callable[["Side"], Awaitable[list[Any]]]
Both = Callable[[Scenario], Awaitable[list[Any]]]
P = ParamSpec("P")
T = TypeVar("T")


class Side:
    """One implementation of the systems, reached through the services' real functions."""

    keys: KeyStore
    resources: Resources
    deps: dict[str, Any]
    # What each implementation reads and writes its own way.
    add_fault: Callable[[str, str, str], Awaitable[None]]
    clear_faults: Callable[[str], Awaitable[int]]
    all_faults: Callable[[], Awaitable[Rows]]
    raw_effects: Callable[[str], Awaitable[dict[str, Rows]]]
    key_row: Callable[[str], Awaitable[tuple[object, ...] | None]]

    @contextlib.asynccontextmanager
    async def opened(self) -> AsyncIterator[Side]:
        async with contextlib.AsyncExitStack() as stack:
            self.deps = {name: await stack.enter_async_context(service.open(self.resources))
                         for name, service in SYSTEMS.items()}  # fmt: skip
            yield self

    async def call(self, req: ActionRequest, wait_s: float | None = None) -> Answer:
        service = SYSTEMS[req.action.split(".")[0]]
        try:
            call = service.call(req, self.deps[service.name])
            return "done", await (call if wait_s is None else asyncio.wait_for(call, wait_s))
        except (Permanent, Transient) as exc:
            return ("failed" if isinstance(exc, Permanent) else "transient"), str(exc)
        except TimeoutError:
            return "timeout", None

    async def claim(self, req: ActionRequest) -> Ticket:
        """The adapter SDK's claim of the request's key."""
        claim = Claiming(req.idempotency_key, req.action, req.order_id, 1, 5, 30.0)
        [ticket] = await self.keys.claim(req.action.split(".")[0], "owner@test", [claim])
        return ticket

    async def faults_of(self, order_id: str) -> Rows:
        return [_stamped(f) for f in await self.all_faults() if f["order_id"] == order_id]

    async def effects(self, order_id: str) -> dict[str, Rows]:
        raw = await self.raw_effects(order_id)
        return {section: [_stamped(r) for r in rows] for section, rows in raw.items()}


def _stamped(row: dict[str, object]) -> dict[str, object]:
    return {c: ("set" if v is not None else v) if c.endswith("_at") else v for c, v in row.items()}


class Postgres(Side):
    def __init__(self, pool: asyncpg.Pool, settings: Settings) -> None:
        self.keys = PgKeys(pool, atomic=True)
        self.resources = Resources(settings, pool, self.keys)
        self.add_fault = functools.partial(faults.add_fault, pool)
        self.clear_faults = functools.partial(faults.clear_faults, pool)
        self.all_faults = functools.partial(faults.list_faults, pool)
        self.raw_effects = functools.partial(effects_for_order, pool)

        async def key_row(key: str) -> tuple[object, ...] | None:
            row = await pool.fetchrow(
                "SELECT action, order_id, outcome, owner, send, attempt, result::text, error, "
                "landed FROM service_keys WHERE key = $1", key,
            )  # fmt: skip
            return None if row is None else (*row.values(),)

        self.key_row = key_row


class Memory(Side):
    def __init__(self, settings: Settings) -> None:
        ticks = itertools.count()

        def clock() -> datetime:  # a microsecond a read: rows of one order stay in call order
            return datetime(2026, 1, 1, tzinfo=UTC) + timedelta(microseconds=next(ticks))

        self.keys = keys = MemoryKeys(clock, atomic=True)
        self.systems = systems = MemorySystems(clock)
        self.resources = Resources(settings, None, keys, memory=systems)
        self.add_fault = _async(systems.add_fault)
        self.clear_faults = _async(systems.clear_faults)
        self.all_faults = _async(systems.list_faults)
        self.raw_effects = _async(systems.effects_for_order)

        async def key_row(key: str) -> tuple[object, ...] | None:
            r = keys.rows.get(key)
            result = None if r is None or r.result is None else jsonb_text(r.result)
            return None if r is None else (r.action, r.order_id, r.outcome, r.owner, r.send,
                                           r.attempt, result, r.error, r.landed)  # fmt: skip

        self.key_row = key_row


def _async(fn: Callable[P, T]) -> Callable[P, Awaitable[T]]:
    async def run(*args: P.args, **kwargs: P.kwargs) -> T:
        return fn(*args, **kwargs)

    return run


class Ids:
    """``new_id`` of the four systems, as a counter both sides restart."""

    def __init__(self) -> None:
        self.tag = uuid.uuid4().hex[:6]  # the database outlives the test: ids must not repeat
        self.reset()

    def reset(self) -> None:
        self._n = itertools.count(1)

    def __call__(self, prefix: str) -> str:
        return f"{prefix}-{self.tag}{next(self._n):04d}"


@pytest.fixture
def both(pool: asyncpg.Pool, settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Both:
    """Runs a scenario on Postgres, then in memory, and asserts the same trace; returns it."""
    ids = Ids()
    for module in (inventory, erp, payments, email):  # each imported the name itself
        monkeypatch.setattr(module, "new_id", ids)

    async def run(scenario: Scenario) -> list[Any]:
        traces = []
        for side in (Postgres(pool, settings), Memory(settings)):
            ids.reset()
            async with side.opened() as opened:
                traces.append(await scenario(opened))
            in_memory = all(isinstance(d, MemorySimulated) for d in side.deps.values())
            assert in_memory == isinstance(side, Memory)  # the wiring chose the right twin
        assert traces[1] == traces[0]  # memory == Postgres: the diff names what differs
        return traces[0]

    return run


def request(
    order_id: str, action: str, params: dict[str, JsonValue], *, key: str | None = None,
    phase: Phase = "forward",
) -> ActionRequest:  # fmt: skip
    return ActionRequest(
        saga_id=f"saga-{order_id}", order_id=order_id, action=action, phase=phase, step=0,
        idempotency_key=key or f"saga-{order_id}:{action}", params=params, timeout_s=5,
    )  # fmt: skip


def undo(order_id: str, action: str, params: dict[str, JsonValue], key: str = "") -> ActionRequest:
    return request(order_id, action, params, phase="compensation",
                   key=f"saga-{order_id}:{action}{key}")  # fmt: skip


def done(answer: Answer) -> dict[str, JsonValue]:
    assert answer[0] == "done" and isinstance(answer[1], dict), answer
    return answer[1]


RESERVE: dict[str, JsonValue] = {"sku": "SKU-1", "quantity": 2}
CREDIT: dict[str, JsonValue] = {"amount_cents": 1200}
CHARGE: dict[str, JsonValue] = {"amount_cents": 2500, "card_token": "tok_visa"}
MAIL: dict[str, JsonValue] = {"customer_email": "ada@example.com"}
# forward action, its params, compensation, the id field, the "undone" flag
UNDOABLE: list[tuple[str, dict[str, JsonValue], str, str, str]] = [
    ("inventory.reserve_stock", RESERVE, "inventory.release_stock", "reservation_id", "released"),
    ("erp.create_credit_note", CREDIT, "erp.void_credit_note", "credit_note_id", "voided"),
    ("payments.charge_card", CHARGE, "payments.refund_charge", "payment_id", "refunded"),
]


# --- forward actions and compensations -----------------------------------------------------------


async def test_every_action_and_compensation_by_id(both: Both, order_id: str) -> None:
    async def scenario(side: Side) -> list[Any]:
        o = order_id
        forward = [await side.call(request(o, f, p)) for f, p, *_ in UNDOABLE]
        forward.append(await side.call(request(o, "erp.validate_address",
                                               {"address": "  1  Main   Street "})))  # fmt: skip
        for action in ("email.send_customer_email", "email.send_confirmation"):
            forward.append(await side.call(request(o, action, MAIL)))
        comps = []
        for (f, _, comp, field, _), answer in zip(UNDOABLE, forward, strict=False):
            params = {field: done(answer)[field], "forward_key": f"saga-{o}:{f}"}
            comps.append(await side.call(undo(o, comp, params)))
            comps.append(await side.call(undo(o, comp, params)))  # redelivered: stored
            comps.append(await side.call(undo(o, comp, params, ":again")))  # already undone
        keys = [await side.key_row(f"saga-{o}:{a}") for a, *_ in UNDOABLE]
        return [forward, comps, keys, await side.effects(o)]

    forward, comps, _, effects = await both(scenario)
    assert [a for a, _ in forward] == ["done"] * 6
    assert forward[3] == ("done", {"valid": True, "address": "1 Main Street"})
    flags = [done(c)[flag] for c, (*_, flag) in zip(comps, [u for u in UNDOABLE for _ in "123"],
                                                      strict=True)]  # fmt: skip
    assert flags == [True, True, False] * 3
    assert [(e["action"], e["times"]) for e in effects["applied"]] == [
        ("inventory.reserve_stock", 1), ("erp.create_credit_note", 1),
        ("payments.charge_card", 1), ("email.send_customer_email", 1),
        ("email.send_confirmation", 1), ("inventory.release_stock", 1),
        ("erp.void_credit_note", 1), ("payments.refund_charge", 1),
    ]  # fmt: skip


async def test_compensations_find_their_target_or_refuse(both: Both, order_id: str) -> None:
    o, other = order_id, f"{order_id}-other"

    async def scenario(side: Side) -> list[Any]:
        out = []
        for f, p, comp, field, _ in UNDOABLE:
            entity = done(await side.call(request(o, f, p)))[field]
            out.append(await side.call(undo(other, comp, {field: entity})))  # not its order's
            out.append(await side.call(undo(o, comp, {"forward_key": f"saga-{o}:{f}"})))
        # A forward key of another action: refused loudly rather than undoing the wrong thing.
        wrong: dict[str, JsonValue] = {"forward_key": f"saga-{o}:inventory.reserve_stock"}
        out.append(await side.call(undo(o, "erp.void_credit_note", wrong, ":wrong")))
        # The forward call was refused: nothing to undo (and its stored refusal stays).
        declined: dict[str, JsonValue] = {"amount_cents": 5, "card_token": "tok_declined_x"}
        out.append(await side.call(request(other, "payments.charge_card", declined)))
        refused: dict[str, JsonValue] = {"forward_key": f"saga-{other}:payments.charge_card"}
        out.append(await side.call(undo(other, "payments.refund_charge", refused, ":2")))
        return [out, await side.effects(o), await side.effects(other)]

    out, effects, nothing = await both(scenario)
    assert all(out[i][0] == "failed" and f"belongs to order {o}, not {other}" in out[i][1]
               for i in (0, 2, 4))  # fmt: skip
    undone = zip((1, 3, 5), UNDOABLE, strict=True)
    assert [done(out[i])[flag] for i, (*_, flag) in undone] == [True] * 3
    assert out[6][0] == "failed" and "belongs to inventory.reserve_stock" in out[6][1]
    assert out[8] == ("done", {"refunded": False, "payment_id": None, "refund_id": None})
    assert [r["status"] for r in effects["reservations"]] == ["released"]
    assert nothing["applied"] == []


# --- idempotency ---------------------------------------------------------------------------------


async def test_a_redelivery_answers_from_the_stored_outcome(both: Both, order_id: str) -> None:
    key, other = f"saga-{order_id}:shared", f"{order_id}-other"

    async def scenario(side: Side) -> list[Any]:
        reserve = request(order_id, "inventory.reserve_stock", RESERVE, key=key)
        bad = request(order_id, "erp.create_credit_note", {"amount_cents": 0})
        out = [await side.call(reserve), await side.call(reserve), await side.call(bad)]
        # The same key with valid parameters now: the first answer stands (Stripe's rule).
        out.append(await side.call(bad.model_copy(update={"params": CREDIT})))
        # A key reused for another action, or for another order: refused.
        out.append(await side.call(request(order_id, "erp.create_credit_note", CREDIT, key=key)))
        out.append(await side.call(request(other, "inventory.reserve_stock", RESERVE, key=key)))
        keys = [await side.key_row(r.idempotency_key) for r in (reserve, bad)]
        return [out, keys, await side.effects(order_id), await side.effects(other)]

    out, _, effects, nothing = await both(scenario)
    assert out[0] == out[1] and out[0][0] == "done"
    refusal = "erp.create_credit_note: amount_cents must be positive, got 0"
    assert out[2] == out[3] == ("failed", refusal)
    reused = f"idempotency key '{key}' was first used for inventory.reserve_stock on order "
    assert out[4] == out[5] == ("failed", reused + order_id)
    assert [e["times"] for e in effects["applied"]] == [1]
    assert nothing["applied"] == []


async def test_refusals(both: Both, order_id: str) -> None:
    calls: list[tuple[str, dict[str, JsonValue]]] = [
        ("email.send_confirmation", {"customer_email": "not-an-address"}),
        ("payments.charge_card", {"amount_cents": 100, "card_token": "tok_declined_funds"}),
        ("payments.charge_card", {"amount_cents": -5, "card_token": "tok_visa"}),
        ("erp.create_credit_note", {"amount_cents": 0}),
        ("inventory.reserve_stock", {"sku": "S", "quantity": 0}),
        ("erp.validate_address", {"address": "the Closed depot"}),
        # Past int4: the SQL's data_exception, stored as a refusal too.
        ("inventory.reserve_stock", {"sku": "S", "quantity": 3_000_000_000}),
    ]

    async def scenario(side: Side) -> list[Any]:
        keys = [f"k{i}-{order_id}" for i in range(len(calls))]
        out = [await side.call(request(order_id, a, p, key=k))
               for k, (a, p) in zip(keys, calls, strict=True)]  # fmt: skip
        return [out, [await side.key_row(k) for k in keys], await side.effects(order_id)]

    out, _, effects = await both(scenario)
    assert all(a == "failed" for a, _ in out)
    assert out[1][1] == "card tok_declined_funds was declined"
    assert out[6][1] == ('inventory refused a value: value "3000000000" is out of range for '
                         "type integer")  # fmt: skip
    assert effects["applied"] == []


async def test_the_calls_of_a_batch_go_as_one_statement(both: Both, order_id: str) -> None:
    other = f"{order_id}-other"
    zero: dict[str, JsonValue] = {"sku": "S", "quantity": 0}

    async def scenario(side: Side) -> list[Any]:
        async with batch_scope():
            out = await asyncio.gather(
                side.call(request(order_id, "inventory.reserve_stock", RESERVE)),
                side.call(request(other, "inventory.reserve_stock", RESERVE)),
                side.call(request(order_id, "inventory.reserve_stock", zero, key=f"{other}:0")),
            )
        return [out, await side.effects(order_id), await side.effects(other)]

    out, _, _ = await both(scenario)
    assert [a for a, _ in out] == ["done", "done", "failed"]


# --- faults --------------------------------------------------------------------------------------


async def test_a_permanent_fault_is_stored(both: Both, order_id: str) -> None:
    async def scenario(side: Side) -> list[Any]:
        await side.add_fault("erp.create_credit_note", order_id, "permanent")
        await side.add_fault("inventory.release_stock", order_id, "permanent")
        create = request(order_id, "erp.create_credit_note", CREDIT)
        out = [await side.call(create)]
        reserved = done(await side.call(request(order_id, "inventory.reserve_stock", RESERVE)))
        out.append(await side.call(undo(order_id, "inventory.release_stock", reserved)))
        faults_set = await side.faults_of(order_id)
        await side.clear_faults(order_id)
        out.append(await side.call(create))  # the fault is gone, the stored refusal is not
        return [out, faults_set, await side.faults_of(order_id), await side.effects(order_id)]

    out, faults_set, cleared, effects = await both(scenario)
    assert out[0] == out[2] == ("failed", "injected permanent fault on erp.create_credit_note")
    assert out[1] == ("failed", "injected permanent fault on inventory.release_stock")
    assert [(f["mode"], f["remaining"]) for f in faults_set] == [("permanent", None)] * 2
    assert cleared == []
    assert [e["action"] for e in effects["applied"]] == ["inventory.reserve_stock"]


async def test_counted_faults_then_the_call_lands(both: Both, order_id: str) -> None:
    async def scenario(side: Side) -> list[Any]:
        await side.add_fault("payments.charge_card", order_id, "transient:2")
        await side.add_fault("inventory.reserve_stock", order_id, "hang:1")
        charge = request(order_id, "payments.charge_card", CHARGE)
        reserve = request(order_id, "inventory.reserve_stock", RESERVE)
        out, keys = [], []
        for req, wait_s in [(charge, None)] * 3 + [(reserve, 0.2), (reserve, None)]:
            out.append(await side.call(req, wait_s))
            keys.append(await side.key_row(req.idempotency_key))
        return [out, keys, await side.faults_of(order_id), await side.effects(order_id)]

    out, keys, faults_left, effects = await both(scenario)
    transient = "injected transient fault on payments.charge_card ({} more to come)"
    assert out[:2] == [("transient", transient.format(1)), ("transient", transient.format(0))]
    assert out[3] == ("timeout", None)
    assert [a for a, _ in out] == ["transient", "transient", "done", "timeout", "done"]
    # Unfinished (nothing landed) after each fault, then the outcome stored.
    assert [k[2] for k in keys] == ["pending", "pending", "done", "pending", "done"]
    assert [(f["mode"], f["remaining"]) for f in faults_left] == [("hang", 0), ("transient", 0)]
    assert [e["times"] for e in effects["applied"]] == [1, 1]


async def test_a_hang_never_answers_and_leaves_the_claim_unfinished(
    both: Both, order_id: str
) -> None:
    async def scenario(side: Side) -> list[Any]:
        await side.add_fault("email.send_confirmation", order_id, "hang")
        mail = request(order_id, "email.send_confirmation", MAIL)
        claimed = await side.claim(mail)
        out = [await side.call(mail, 0.2), await side.call(mail, 0.2)]  # "hang": every call
        left = [await side.key_row(mail.idempotency_key), await side.effects(order_id)]
        # Unfinished, so a settle fences it (atomic: nothing landed); then it is refused.
        settled = await side.keys.settle(mail.idempotency_key, "email", mail.action, order_id)
        await side.clear_faults(order_id)
        out.append(await side.call(mail))
        return [claimed, out, left, settled, await side.effects(order_id)]

    _, out, (key, effects), _, after = await both(scenario)
    assert out[:2] == [("timeout", None)] * 2
    assert key[2:4] == ("pending", "owner@test")
    assert effects["emails"] == after["emails"] == []
    assert out[2] == ("failed", "fenced by a settle: claimed by owner@test, never finished, so "
                                "nothing landed")  # fmt: skip


# --- fences --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("forward", "params", "comp", "field", "flag"), UNDOABLE)
async def test_undoing_a_call_that_never_ran_fences_its_key(
    both: Both, order_id: str, forward: str, params: dict[str, JsonValue], comp: str, field: str,
    flag: str,
) -> None:  # fmt: skip
    claimed = f"{order_id}-claimed"

    async def scenario(side: Side) -> list[Any]:
        out: list[Any] = []
        for o in (order_id, claimed):
            late = request(o, forward, params)
            if o == claimed:  # claimed by the adapter SDK, never finished: fenced all the same
                out.append(await side.claim(late))
            out.append(await side.call(undo(o, comp, {"forward_key": late.idempotency_key})))
            out.append(await side.key_row(late.idempotency_key))
            out.append(await side.call(late))  # the late forward call: refused, lands nothing
            out.append(await side.claim(late))  # and the adapter SDK's claim sees the fence
            out.append(await side.effects(o))
        return out

    out = await both(scenario)
    assert out[5].kind == "call"
    for o, at in ((order_id, 0), (claimed, 6)):
        assert done(out[at])[flag] is False and done(out[at])[field] is None
        assert out[at + 1][2] == "fenced"
        assert out[at + 2] == ("failed", f"not run: {comp} (saga-{o}:{comp}) compensated it first")
        assert out[at + 3].kind == "fenced"
        assert out[at + 4]["applied"] == []


async def test_a_claimed_call_stores_its_outcome_in_the_claimed_row(
    both: Both, order_id: str
) -> None:
    async def scenario(side: Side) -> list[Any]:
        note = request(order_id, "erp.create_credit_note", CREDIT)
        out = [await side.claim(note), await side.call(note)]
        return [*out, await side.key_row(note.idempotency_key), await side.claim(note)]

    ticket, answer, key, again = await both(scenario)
    assert ticket.kind == "call" and ticket.attempt == 1
    assert key[2:6] == ("done", "owner@test", 1, 1)
    assert again.kind == "done" and again.result == done(answer)


# --- values the functions never send: Postgres's conversions and constraints -----------------


async def test_values_straight_to_apply(both: Both, order_id: str) -> None:
    charge = Claiming(f"{order_id}:charge", "payments.charge_card", order_id, 1, 5, 30.0)
    writes: list[tuple[str, dict[str, JsonValue]]] = [
        ("inventory.reserve_stock", {"reservation_id": f"r-{order_id}", "sku": 5, "quantity": "7"}),
        ("inventory.reserve_stock", {"reservation_id": "r2", "sku": "s", "quantity": 2.5}),
        ("inventory.reserve_stock", {"reservation_id": "r3", "sku": "s", "quantity": " x"}),
        ("inventory.reserve_stock", {"sku": "s", "quantity": 1}),  # no id: NOT NULL
        ("inventory.reserve_stock", {"reservation_id": f"r-{order_id}", "sku": "s", "quantity": 1}),
        ("inventory.release_stock", {"reservation_id": 5}),
        ("inventory.teleport_stock", {}),
        ("erp.validate_address", {"n": 1e20, "f": 1.0, "o": {"bb": [1, 2.5], "a": None}}),
        ("payments.refund_charge", {"forward_key": charge.key}),  # its result has no payment_id
    ]

    async def scenario(side: Side) -> list[Any]:
        await side.keys.claim("payments", "owner@test", [charge])
        await side.keys.record(charge.key, {})  # a status hook said: done, with no id
        out: list[Any] = []
        for i, (action, values) in enumerate(writes):
            deps = side.deps[action.split(".")[0]]
            c = Call(action=action, params=None, key=f"{order_id}:{i}", saga_id="s",
                     order_id=order_id, phase="forward", attempt=1, send=1,
                     deadline=time.monotonic() + 5, deps=deps)  # fmt: skip
            try:
                out.append(await deps.apply(c, values))
            except Exception as exc:  # a refusal, or the statement failing (asyncpg's types)
                out.append((type(exc).__name__, str(exc).splitlines()[0]))
        return [out, await side.effects(order_id)]

    out, _ = await both(scenario)
    assert out[0] == {"reservation_id": f"r-{order_id}"}
    assert out[3][0] == "NotNullViolationError" and out[4][0] == "UniqueViolationError"
    assert out[7] == {"n": 10**20, "f": 1.0, "o": {"a": None, "bb": [1, 2.5]}}
    assert out[8] == ("Permanent", f"payments.refund_charge: the stored result of "
                                   f"'{charge.key}' has no payment_id")  # fmt: skip
