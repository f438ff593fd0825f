"""What one simulated run does, drawn from its seed before it starts: the sagas the agents
start (and what each agent does besides: repeats, conflicts, aborts, decisions at gates), the
faults of the systems, and the faults of the world (processes killed or frozen, the broker
crashing, the database away). A plan is a value: a failing run's plan is shrunk by dropping
parts of it and running again (``saga_app.sim.shrink``)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Literal

from pydantic import JsonValue

Gate = Literal["approve", "reject", "agent_first", "none"]
# "queues": every request queue lost at once, as its node going down loses it (deleted), or
# emptied (a confirmed message lost from a queue that survives).
FaultKind = Literal["crash", "point", "freeze", "broker", "database", "queues"]
SAGAS = ("refund", "refund", "checkout", "checkout_approved", "refund_by_text")
# Faults a system may have for one order: (action, mode), modes as `saga faults add` takes them.
SYSTEM_FAULTS: tuple[tuple[str, str], ...] = (
    ("inventory.reserve_stock", "transient:2"),
    ("inventory.reserve_stock", "permanent"),
    ("erp.create_credit_note", "permanent"),
    ("erp.create_credit_note", "hang:1"),
    ("payments.charge_card", "transient:5"),
    ("erp.validate_address", "permanent"),
    ("email.send_customer_email", "hang:1"),
    ("email.send_customer_email", "hang"),
    ("email.send_customer_email", "permanent"),
    ("email.send_confirmation", "hang"),
    ("erp.void_credit_note", "permanent"),
    ("erp.void_credit_note", "transient:3"),
    ("inventory.release_stock", "hang:2"),
    ("payments.refund_charge", "transient:7"),
)


@dataclass(frozen=True)
class SagaPlan:
    number: int
    at: float  # when its agent starts it (virtual seconds)
    saga_id: str
    order_id: str
    saga: str
    params: dict[str, JsonValue]
    agent: int
    faults: tuple[tuple[str, str], ...] = ()
    text_delay_s: float = 0.0  # the SMS gateway lands this order's text this late
    copies: int = 1  # the start sent this many times under one message id
    again: bool = False  # then sent again under a new message id
    conflict: bool = False  # then its saga id reused with other parameters (refused)
    abort_after_s: float | None = None  # its agent aborts it this long after the start
    gate: Gate = "none"
    sabotage: int = 0  # the coordinator fails on its start this many times


@dataclass(frozen=True)
class Fault:
    at: float
    kind: FaultKind
    target: str  # a process's name; "" for the broker or the database
    for_s: float
    point: str = ""  # "point": the process dies the next time it passes this crash point


@dataclass(frozen=True)
class Plan:
    seed: int
    sagas: tuple[SagaPlan, ...]
    faults: tuple[Fault, ...] = ()
    forgeries: int = 0  # forged and malformed messages a rogue agent sends
    coordinators: int = 2
    email_processes: int = 2
    text_status_hook: bool = True
    horizon_s: float = field(default=0.0)  # when the last saga starts

    @property
    def size(self) -> int:
        return len(self.sagas) + len(self.faults) + self.forgeries


PROCESSES = ("coordinator-0", "coordinator-1", "inventory-0", "erp-0", "payments-0",
             "email-0", "email-1", "sms-0")  # fmt: skip
# Where a process may die on purpose (``World.crash_point``): a coordinator between its commit
# and its publishes, and between those and the ack; an adapter between its claim and the call,
# and between the call and recording its outcome (an adapter dying mid-call).
POINTS = {
    "coordinator": ("coordinator.after_commit", "coordinator.after_publish"),
    "adapter": ("adapter.before_call", "adapter.after_call"),
}


def generate(seed: int, sagas: int, *, faults: bool = True, agents: int = 4) -> Plan:
    """``sagas`` sagas over about ``sagas / 20`` virtual seconds from ``agents`` agents; with
    ``faults``, systems failing for some orders and the world failing now and then."""
    rng = random.Random(seed)
    span = max(sagas / 20.0, 5.0)
    planned = [_saga(rng, n, rng.uniform(0, span), agents, faults) for n in range(sagas)]
    planned = _share_orders(rng, planned)
    world: list[Fault] = []
    if faults:
        for _ in range(max(1, int(span / 15))):
            world.append(_world_fault(rng, span))
    hook = rng.random() < 0.5
    if faults:  # drawn from a stream of their own: a seed's other draws stay as they were
        points = random.Random(f"{seed}/points")
        world += [_point_fault(points, span) for _ in range(max(1, int(span / 8)))]
        lost = random.Random(f"{seed}/queues")
        world += [_queue_fault(lost, span) for _ in range(max(1, int(span / 10)))]
    return Plan(
        seed=seed, sagas=tuple(sorted(planned, key=lambda s: (s.at, s.number))),
        faults=tuple(sorted(world, key=lambda f: f.at)), forgeries=3 if faults else 0,
        text_status_hook=hook, horizon_s=span,
    )  # fmt: skip


def _saga(rng: random.Random, n: int, at: float, agents: int, faulty: bool) -> SagaPlan:
    saga = rng.choice(SAGAS)
    params: dict[str, JsonValue] = {
        "sku": f"SKU-{n % 7}", "quantity": 1 + n % 3, "amount_cents": 100 + n,
        "customer_email": f"c{n}@example.com", "card_token": "tok_visa",
        "address": f"{n} Main Street", "customer_phone": f"+100{n:07d}",
    }  # fmt: skip

    def f(p: float) -> bool:  # a draw per question, whether or not faults are on
        return rng.random() < p and faulty

    return SagaPlan(
        number=n, at=at, saga_id=f"s-{n}", order_id=f"o-{n}", saga=saga, params=params,
        agent=n % agents,
        faults=tuple(rng.sample(SYSTEM_FAULTS, k=rng.randint(1, 2))) if f(0.25) else (),
        text_delay_s=rng.choice([0.5, 5.0, 40.0]) if f(0.3) else 0.0,
        copies=3 if f(0.1) else 1, again=f(0.1), conflict=f(0.05),
        abort_after_s=rng.uniform(0.0, 3.0) if f(0.15) else None,
        gate=rng.choice(["approve", "approve", "reject", "agent_first"]),
        sabotage=rng.choice([1, 3, 9]) if f(0.03) else 0,
    )  # fmt: skip


def _share_orders(rng: random.Random, planned: list[SagaPlan]) -> list[SagaPlan]:
    """One saga in ten goes to the order of the saga before it, started right behind it by
    the same agent: the second waits for the first, in the order they were sent."""
    out: list[SagaPlan] = []
    for saga in planned:
        if out and rng.random() < 0.1:
            first = out[-1]
            saga = SagaPlan(**{**saga.__dict__, "order_id": first.order_id,
                               "agent": first.agent, "at": first.at})  # fmt: skip
        out.append(saga)
    return out


def _world_fault(rng: random.Random, span: float) -> Fault:
    kind: FaultKind = rng.choice(["crash", "crash", "freeze", "broker", "database"])
    at = rng.uniform(1.0, span)
    if kind == "crash":
        return Fault(at, kind, rng.choice(PROCESSES), rng.uniform(0.5, 5.0))
    if kind == "freeze":
        target = rng.choice(["email-0", "email-1", "sms-0", "erp-0"])
        return Fault(at, kind, target, rng.uniform(2.0, 45.0))
    return Fault(at, kind, "", rng.uniform(0.5, 4.0))


def _queue_fault(rng: random.Random, span: float) -> Fault:
    return Fault(rng.uniform(1.0, span), "queues", rng.choice(["deleted", "emptied"]), 0.0)


def _point_fault(rng: random.Random, span: float) -> Fault:
    target = rng.choice(PROCESSES)
    point = rng.choice(POINTS["coordinator" if target.startswith("coordinator") else "adapter"])
    return Fault(rng.uniform(1.0, span), "point", target, rng.uniform(0.5, 5.0), point)
