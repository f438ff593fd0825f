"""The machine's rules under random sequences of outcomes, aborts, resumes, stale messages,
approval gates (approve, reject, time out, an agent trying to approve) and steps in doubt
(settle answers of every kind, settle deadlines, late outcomes, people settling), checked
against a model the test keeps on its own: rule 1 (exactly one thing in flight while running),
rule 2 (a forward step only while running, in order, never a gated step before its approval;
nothing compensated and nothing run while a step is in doubt; never compensated with one in
doubt), rule 4 (compensations only for what may have landed, in the declared order), rule 5."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

from saga_coordinator import convoy, deadline
from saga_coordinator.convoy import OrderView
from saga_coordinator.register import gate_key
from saga_coordinator.transition import Transition
from saga_shared.model.catalog import ActionClass
from saga_shared.model.gateway import check_catalog
from saga_shared.model.messages import (
    ActionDone,
    ActionFailed,
    ActionRequest,
    ApproveSaga,
    DeadlineReached,
    Gate,
    Plan,
    PlanStep,
    RejectSaga,
    SettleRequest,
    StartSaga,
)
from tests.unit.factories import (
    AGENT,
    T0,
    Driver,
    assert_ignored,
    compensable,
    done_for,
    event,
    failed_for,
    irreversible,
    make_catalog,
    read_only,
    requests_of,
    sender,
    settles_of,
    with_residue,
)

PROP = make_catalog(
    actions={
        "inventory.a": compensable("inventory.undo_a"),
        "inventory.b": compensable("inventory.undo_b", result=("b_id", "b_ref")),
        "payments.c": with_residue("payments.undo_c"),
        "erp.d": compensable("erp.undo_d"),
        "erp.r1": read_only(),
        "erp.r2": read_only(),
        "email.x": irreversible(),
        "email.y": irreversible(),
    },
    compensations=["inventory.undo_a", "inventory.undo_b", "payments.undo_c", "erp.undo_d"],
)
UNDOABLE = ["inventory.a", "inventory.b", "payments.c", "erp.d"]


def random_plan(rng: random.Random) -> tuple[list[str], list[str], dict[str, Gate]]:
    head = rng.sample([*UNDOABLE, "erp.r1"], k=rng.randint(0, 5))
    tail = rng.sample(["email.x", "email.y", "erp.r2"], k=rng.randint(0, 3))
    steps = head + tail or ["erp.r1"]
    priority = rng.sample(steps, k=rng.randint(0, min(2, len(steps))))
    gates = {
        a: Gate(on_timeout=rng.choice(["compensate", "approve"]), require_person=rng.random() < 0.7)
        for a in steps
        if rng.random() < 0.25
    }
    return steps, priority, gates


def start(steps: list[str], priority: list[str], gates: dict[str, Gate], saga_id: str) -> StartSaga:
    plan = Plan(
        steps=tuple(PlanStep(action=a, gate=gates.get(a)) for a in steps),
        compensation_priority=tuple(priority),
    )
    return StartSaga(saga_id=saga_id, order_id="order-1", plan=plan, sender=AGENT)


@dataclass
class Model:
    """What the test knows independently of the machine: which steps may have landed, in which
    order, and which compensations succeeded."""

    steps: list[str]
    priority: list[str]
    gates: dict[str, Gate] = field(default_factory=dict)
    approved: set[int] = field(default_factory=set)  # gates opened, by a person or a timeout
    armed: deadline.Arm | None = None  # the saga's deadline as the processor would store it
    active: str | None = None  # the order's active saga as the processor would keep it
    landed: list[int] = field(default_factory=list)
    undone: set[int] = field(default_factory=set)
    failed_or_aborted: bool = False

    def undoable(self, index: int) -> bool:
        return PROP.actions[self.steps[index]].action_class.needs_compensation

    def irreversible(self, index: int) -> bool:
        return PROP.actions[self.steps[index]].action_class is ActionClass.IRREVERSIBLE

    def undo_order(self) -> list[int]:
        todo = [i for i in self.landed if self.undoable(i)]
        first = [i for a in self.priority for i in todo if self.steps[i] == a]
        return first + [i for i in reversed(todo) if i not in first]

    def next_undo(self) -> int | None:
        return next((i for i in self.undo_order() if i not in self.undone), None)


def check_deadline_and_order(d: Driver, t: Transition, m: Model) -> None:
    """Rules 1 and 6 as the pure decisions the processor stores: a request out always has a
    deadline for that very send, a gate its time-out, nothing in flight none; a saga holds
    its order from its start until it ends, and hands it on then."""
    state = d.st
    if t.changed:
        change = deadline.after(state, t, T0)
        if isinstance(change, deadline.Arm):
            m.armed = change
        elif isinstance(change, deadline.Disarm):
            m.armed = None
    flight = d.in_flight()
    if state.status in ("running", "compensating"):
        assert flight is not None and m.armed is not None, "nothing would ever wake it"
        assert (m.armed.idempotency_key, m.armed.attempt) == (
            flight.idempotency_key, flight.attempt,
        )  # fmt: skip
    elif state.status == "awaiting_approval":
        assert m.armed is not None and m.armed.phase == "gate"
    else:
        assert m.armed is None, f"a deadline left armed at {state.status}"
    order = OrderView("order-1", m.active, 1, 0, (), False, False)
    decision = convoy.hand_over(order, state.saga_id, state.status)
    if decision == "take":
        m.active = state.saga_id
    elif decision == "pass":
        m.active = None
    held = state.status in ("running", "awaiting_approval", "compensating", "needs_human")
    assert (m.active == state.saga_id) == held, (state.status, m.active)


def check_doubt(d: Driver, t: Transition) -> None:
    """Rule 2 with doubt: while a step is in doubt nothing runs and nothing is compensated; a
    settle goes only for an irreversible step that is out or in doubt; a saga in doubt is
    never reported compensated or completed."""
    state = d.st
    doubtful = [s for s in state.steps if s.status == "in_doubt"]
    assert len(doubtful) <= 1
    if doubtful or any(s.settling for s in state.steps):
        assert requests_of(t) == [], "a request went out while a step is in doubt or settling"
    for settle in settles_of(t):
        step = state.steps[settle.step]
        assert step.action_class is ActionClass.IRREVERSIBLE
        assert step.status in ("in_doubt", "running") and step.settling
    if state.status in ("compensated", "completed"):
        assert not doubtful and not any(s.settling for s in state.steps)
        assert not state.awaiting, "a command's answer was never sent"
    if state.status == "needs_human" and doubtful:
        assert not doubtful[0].settling


def check_invariants(d: Driver, t: Transition, m: Model) -> None:
    check_deadline_and_order(d, t, m)
    check_doubt(d, t)
    state = d.st
    busy = [s.index for s in state.steps if s.in_flight]
    assert len(busy) <= 1, f"several actions in flight: {busy}"
    # Rule 1: a saga that is not finished (or waiting for a person) always waits for one outcome
    if state.status in ("running", "compensating"):
        assert len(busy) == 1, f"{state.status} with nothing in flight: it would hang"
    else:
        assert busy == []

    reqs = requests_of(t)
    assert len(reqs) <= 1
    for req in reqs:
        step = state.steps[req.step]
        if req.phase == "forward":
            # Rule 2 (and ordering): a forward action runs only while the saga is running and
            # every earlier step is done
            assert state.status == "running"
            assert not m.failed_or_aborted
            assert all(s.status == "done" for s in state.steps[: req.step])
            assert step.status == "running"
            assert req.action == m.steps[req.step]
            # A gated step runs only once its gate was opened.
            if m.steps[req.step] in m.gates:
                assert req.step in m.approved, f"step {req.step} ran past a closed gate"
        else:
            # Rule 4: only for steps that may have landed, undoable, in the declared order
            assert req.step in m.landed, f"compensation of step {req.step}, which never landed"
            assert m.undoable(req.step)
            assert req.step == m.next_undo(), (req.step, m.undo_order(), m.undone)
            assert step.compensation_status == "running"

    landed_by_seq = sorted(
        (s for s in state.steps if s.landed_seq is not None), key=lambda s: s.landed_seq or 0
    )
    assert [s.index for s in landed_by_seq] == m.landed

    if state.status == "awaiting_approval":
        waiting = [s for s in state.steps if s.gate_status == "waiting"]
        assert len(waiting) == 1 and waiting[0].status == "pending"
        assert m.steps[waiting[0].index] in m.gates
        assert not m.failed_or_aborted
    if state.status == "completed":
        assert all(s.status == "done" for s in state.steps)
        assert not d.compensation_requests()
        event(t, "saga.completed")
    if state.status == "compensated":
        # Rule 5: never compensated while a landed undoable step is not undone
        for i in m.landed:
            if m.undoable(i):
                assert state.steps[i].compensation_status == "compensated"
        event(t, "saga.compensated")
    if state.status == "needs_human":
        assert state.needs_human_reason
        stuck = [s.compensation_status for s in state.steps].count("failed")
        stuck += [s.status for s in state.steps].count("in_doubt")
        assert stuck == 1
    forward_doubt = state.status == "needs_human" and state.paused_from == "running"
    if state.status in ("compensating", "compensated", "needs_human") and not forward_doubt:
        for s in state.steps:
            if s.index not in m.landed and s.status not in ("running", "in_doubt"):
                assert s.compensation_status == "none"
            if s.index in m.landed and s.action_class is ActionClass.IRREVERSIBLE:
                assert s.compensation_status == "impossible"
            if s.action_class in (ActionClass.READ_ONLY, ActionClass.IRREVERSIBLE):
                assert s.compensation_status in ("none", "impossible")


def simulate(seed: int, stats: Counter[str]) -> None:
    rng = random.Random(seed)
    steps, priority, gates = random_plan(rng)
    m = Model(steps, priority, gates)
    d = Driver(PROP)
    t = d.feed(start(steps, priority, gates, f"saga-{seed}"))
    assert d.state is not None, t.note
    check_invariants(d, t, m)
    answered: list[ActionDone | ActionFailed] = []
    p_fail = rng.choice([0.05, 0.2, 0.4])
    p_comp_fail = rng.choice([0.0, 0.2, 0.5])

    for turn in range(400):
        cooperative = turn > 200  # late on, everything succeeds: the saga must then finish
        state = d.st
        if state.status in ("completed", "compensated", "resolved"):
            break
        if state.status == "needs_human" and any(s.status == "in_doubt" for s in state.steps):
            decided = for_a_person(d, m, rng, cooperative, stats)
            if decided is None:
                break  # left to a person
            check_invariants(d, decided, m)
            continue
        if state.status == "needs_human":
            x = rng.random()
            if not cooperative and x < 0.1:
                break  # left to a person: a terminal state until someone resumes it
            if not cooperative and x < 0.2:
                t = d.resolve(f"done by hand at {turn}")
                assert d.status() == "resolved"
                assert requests_of(t) == []
                stats["resolve"] += 1
                break
            t = d.resume(f"attempt {turn}")
            stats["resume"] += 1
            check_invariants(d, t, m)
            continue
        if state.status == "awaiting_approval":
            t = at_the_gate(d, m, rng, cooperative, stats)
            check_invariants(d, t, m)
            continue
        req = d.in_flight()
        assert req is not None
        r = rng.random()
        if answered and r < 0.1:
            # a redelivered or out-of-date outcome: absorbed without a trace
            before = d.state
            t = d.feed(rng.choice(answered))
            assert_ignored(d, t, before)
            stats["stale"] += 1
            continue
        if state.status == "running" and r < 0.17 and not cooperative:
            t = d.abort(f"turn {turn}")
            m.failed_or_aborted = True
            stats["abort"] += 1
            check_invariants(d, t, m)
            continue
        if isinstance(req, SettleRequest):
            t = answer_settle(d, m, req, rng, cooperative, stats)
            check_invariants(d, t, m)
            continue
        step = d.step(req.step)
        message: ActionDone | ActionFailed
        if req.phase == "forward":
            x = rng.random()
            if m.irreversible(req.step) and not cooperative and rng.random() < 0.4:
                x = p_fail  # an e-mail that times out: its outcome is unknown, half the time
            if cooperative or x >= p_fail + 0.05:
                message = done_for(req, {f: f"{f}-{req.step}" for f in step.result_fields})
                m.landed.append(req.step)
            elif x < 0.05 and step.result_fields and step.action_class.needs_compensation:
                message = done_for(req, {})  # the adapter forgot the identifier
                m.landed.append(req.step)
                m.failed_or_aborted = True
            else:
                unknown = rng.random() < (0.85 if m.irreversible(req.step) else 0.5)
                message = failed_for(req, "no", effect_unknown=unknown, tries=rng.randint(1, 3))
                if unknown and not m.irreversible(req.step):
                    m.landed.append(req.step)  # an irreversible one is in doubt: settled first
                if not (unknown and m.irreversible(req.step)):
                    m.failed_or_aborted = True
        elif cooperative or rng.random() >= p_comp_fail:
            message = done_for(req, {"undone": True})
            m.undone.add(req.step)
        else:
            message = failed_for(req, "undo failed", effect_unknown=rng.random() < 0.5)
            stats["compensation_failed"] += 1
        t = d.feed(message)
        assert t.changed is True
        answered.append(message)
        check_invariants(d, t, m)

    final = d.st
    assert final.status in ("completed", "compensated", "needs_human", "resolved"), final.status
    assert d.in_flight() is None
    stats[final.status] += 1
    if any(s.compensation_status == "impossible" for s in final.steps):
        stats["impossible"] += 1
    if final.compensation_priority and d.compensation_requests():
        stats["priority"] += 1


def _forward_of(d: Driver, step: int) -> ActionRequest:
    return next(r for r in reversed(d.requests) if r.step == step and r.phase == "forward")


def _settled_one_way(d: Driver, m: Model, step: int, happened: bool) -> None:
    if happened:
        m.landed.append(step)
    elif d.st.status in ("compensating", "compensated"):
        m.failed_or_aborted = True


def answer_settle(
    d: Driver, m: Model, req: SettleRequest, rng: random.Random, cooperative: bool,
    stats: Counter[str],
) -> Transition:  # fmt: skip
    """The service's answer to a settle, its deadline, or the step's own outcome meanwhile."""
    step = d.step(req.step)
    x = rng.random()
    if step.status == "running" and x < 0.25:  # an abort's settle: the call answers first
        forward = _forward_of(d, req.step)
        stats["outcome_while_settling"] += 1
        if rng.random() < 0.5:
            t = d.feed(done_for(forward, {}))
            m.landed.append(req.step)
        else:
            t = d.feed(failed_for(forward, "no", effect_unknown=rng.random() < 0.5))
        return t
    if cooperative or x < 0.5:
        verdict = rng.choice(["done", "fenced", "failed"])
        t = d.settled(verdict, result={} if verdict == "done" else None)  # type: ignore[arg-type]
        stats["settled_done" if verdict == "done" else "settled_fenced"] += 1
        _settled_one_way(d, m, req.step, verdict == "done")
        return t
    if x < 0.6:
        stats["settle_running"] += 1
        return d.settled("running", reason="a live call")
    if x < 0.75:
        stats["settle_in_doubt"] += 1
        return d.settled("in_doubt", reason="no status hook")
    stats["settle_deadline"] += 1
    ids = {"saga_id": d.saga_id, "order_id": "order-1"}
    key = req.idempotency_key
    return d.feed(DeadlineReached(**ids, step=req.step, phase="settle", idempotency_key=key,
                                  attempt=req.attempt))  # fmt: skip


def for_a_person(
    d: Driver, m: Model, rng: random.Random, cooperative: bool, stats: Counter[str]
) -> Transition | None:
    """A saga stopped on a step in doubt: a late outcome, a person's decision, a resume, a
    refused attempt by someone who may not settle, or nobody (None)."""
    step = next(s for s in d.st.steps if s.status == "in_doubt")
    x = rng.random()
    if x < 0.15:
        stats["late_outcome"] += 1
        t = d.feed(done_for(_forward_of(d, step.index), {}))
        m.landed.append(step.index)
        return t
    if x < 0.3:
        stats["person_happened"] += 1
        t = d.settle(step.index, happened=True, version=d.st.version)
        m.landed.append(step.index)
        return t
    if x < 0.45:
        stats["person_did_not_happen"] += 1
        return d.settle(step.index, happened=False)  # the service's fence answers it
    if x < 0.6 or cooperative:
        stats["resume_doubt"] += 1
        return d.resume("asked again")
    if x < 0.8:
        before = d.state
        t = d.settle(step.index, happened=True, role="ops", by="ops")
        assert d.state is not None and before is not None
        assert d.st.steps == before.steps and requests_of(t) == []
        stats["ops_refused"] += 1
        return t
    return None


def at_the_gate(
    d: Driver, m: Model, rng: random.Random, cooperative: bool, stats: Counter[str]
) -> Transition:
    """A decision at the gate the saga waits at, or an attempt that must change nothing."""
    step = next(s for s in d.st.steps if s.gate_status == "waiting")
    gate = m.gates[m.steps[step.index]]
    ids = {"saga_id": d.saga_id, "order_id": "order-1"}
    x = 0.0 if cooperative else rng.random()
    if x < 0.35:
        t = d.feed(ApproveSaga(**ids, note="go", sender=sender()))
        m.approved.add(step.index)
        stats["approve"] += 1
    elif x < 0.5:
        # An agent never decides at a gate (it could open the gate meant to stop it): the
        # register does not move, nothing is sent.
        before = d.state
        t = d.feed(ApproveSaga(**ids, note="me", sender=AGENT))
        assert d.st.status == "awaiting_approval"
        assert d.st.steps == before.steps if before is not None else False
        assert requests_of(t) == []
        stats["agent_refused"] += 1
    elif x < 0.7:
        t = d.feed(RejectSaga(**ids, reason="no", sender=sender()))
        m.failed_or_aborted = True
        stats["reject"] += 1
    else:
        key = gate_key(d.saga_id, step)
        t = d.feed(
            DeadlineReached(**ids, step=step.index, phase="gate", idempotency_key=key, attempt=1)
        )
        if gate.on_timeout == "approve":
            m.approved.add(step.index)
        else:
            m.failed_or_aborted = True
        stats["gate_timeout"] += 1
    return t


def test_rules_hold_over_random_sequences_of_outcomes() -> None:
    stats: Counter[str] = Counter()
    for seed in range(1500):
        simulate(seed, stats)
    # the generator really exercised every path it claims to
    for kind in (
        "completed",
        "compensated",
        "needs_human",
        "resolve",
        "abort",
        "resume",
        "stale",
        "compensation_failed",
        "impossible",
        "priority",
        "approve",
        "agent_refused",
        "reject",
        "gate_timeout",
        "outcome_while_settling",
        "settled_done",
        "settled_fenced",
        "settle_running",
        "settle_in_doubt",
        "settle_deadline",
        "late_outcome",
        "person_happened",
        "person_did_not_happen",
        "resume_doubt",
        "ops_refused",
    ):
        assert stats[kind] >= 5, (kind, stats)


def test_the_catalog_of_this_module_passes_the_gateway() -> None:
    check_catalog(PROP)  # a catalog that broke a rule would make these tests meaningless
