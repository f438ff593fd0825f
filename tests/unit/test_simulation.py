"""The deterministic simulation of the whole system (``saga_app.sim``): the product's own
coordinator, adapters, key records and rules over a simulated RabbitMQ and the in-memory store,
with faults, on a virtual clock, every run replayable from its seed. Thousands of sagas keep
every rule; and each bug found so far, put back by patching the code here (never by a switch in
the product), is found within a stated budget of seeds."""

from __future__ import annotations

import hashlib
from dataclasses import replace

import pytest

from saga_app.sim import plan as plans
from saga_app.sim.runner import Outcome, report, run, shrink, sweep, timeline
from saga_coordinator import doubt, repeats
from saga_coordinator.progress import advance, begin_compensation, land
from saga_coordinator.register import SagaState, Step
from saga_coordinator.transition import Outgoing, Transition, event, ignored
from saga_services.keys import MemoryKeys, Ticket
from saga_shared.model.messages import StartSaga
from saga_shared.storage import sql

# Seeds of 150 sagas each a bug may take to show before its test fails (measured:
# docs/results/chaos.md).
BUDGET = 40


def test_ten_thousand_sagas_with_faults_keep_every_rule() -> None:
    summary = sweep(range(20), 500, workers=2)
    print(f"\n{summary.sagas} simulated sagas in {summary.wall_s:.1f}s ({summary.rate:.0f}/s)")
    assert summary.sagas == 10_000
    assert summary.failing == {}, summary.failing


def _digest(outcome: Outcome) -> str:
    h = hashlib.sha256()
    for event_ in outcome.world.broker.trace:
        h.update(repr(event_).encode())
    h.update(timeline(outcome).encode())
    return h.hexdigest()


def test_a_seed_replays_bit_for_bit_and_another_seed_differs() -> None:
    plan = plans.generate(11, 150)
    first, again, other = run(plan), run(plan), run(plans.generate(12, 150))
    assert _digest(first) == _digest(again)
    assert first.statuses == again.statuses
    assert _digest(first) != _digest(other)
    # the run really had faults, sagas ending every way, and the world failing
    assert plan.faults and {"completed", "compensated"} <= set(first.statuses)


def test_processes_die_at_every_crash_point_and_every_rule_holds() -> None:
    """A coordinator between its commit and its publishes, and before its ack; an adapter
    between its claim and the call, and after the call before its outcome is recorded (dying
    mid-call): each dies there, comes back, and no rule breaks."""
    where = [
        ("coordinator-0", "coordinator.after_commit"),
        ("coordinator-1", "coordinator.after_publish"),
        ("email-0", "adapter.before_call"), ("email-1", "adapter.after_call"),
        ("erp-0", "adapter.after_call"), ("sms-0", "adapter.before_call"),
    ]  # fmt: skip
    base = plans.generate(5, 150)
    points = tuple(plans.Fault(1.0 + i, "point", p, 2.0, at) for i, (p, at) in enumerate(where))
    outcome = run(replace(base, faults=points))

    died = {what for _, who, what in outcome.world.records.timeline if what.startswith("killed")}
    assert died == {f"killed at {point}" for _, point in where}
    assert outcome.violations == []
    assert {"completed", "compensated"} <= set(outcome.statuses)


def test_a_forgery_sent_while_the_broker_is_down_is_sent_again_and_dead_lettered() -> None:
    """Found by the long run (seed 500922): the rogue's forged outcome, refused while the
    broker was down, never reached the coordinator, and the check blamed the product."""
    base = plans.generate(5, 150)
    down = plans.Fault(base.sagas[0].at + 0.9, "broker", "", 2.0)
    outcome = run(replace(base, faults=(down,)))

    refused = [what for _, who, what in outcome.world.records.timeline
               if who == "saga-agent-rogue" and "BrokerDown" in what]  # fmt: skip
    assert refused  # the broker was down when the rogue first tried
    assert outcome.world.records.forged is not None
    assert "forged" in {letter.reason for letter in outcome.world.records.letters}
    assert outcome.violations == []


def test_a_repeat_that_overtakes_its_lost_start_starts_the_saga() -> None:
    """Found by the long run (seed 501911 before the request queues changed its draws): the
    broker lost a confirmed start in a crash; the agent's repeat under a new message id came
    first and started the saga, and the start, sent again under its own id, was answered
    "already started". Now made on purpose: every start repeated, the broker crashing right
    after them (seed 297 of that plan loses a start)."""
    base = plans.generate(297, 40, faults=False)
    outcome = run(replace(
        base, sagas=tuple(replace(s, again=True) for s in base.sagas),
        faults=(plans.Fault(1.0, "broker", "", 2.0),),
    ))  # fmt: skip
    lost = {e.message_id for e in outcome.world.broker.trace if e.kind == "lost"}
    answers = outcome.world.records.answers
    first = [m for m, got in answers.items() if m.endswith("-again") and got[-1].reason == ""]

    assert first, "this seed no longer has a repeat overtaking its lost start: pick another"
    for again in first:  # each started its saga, its start was lost and then repeated it
        start = again.replace("-again", "-start")
        assert start in lost
        assert answers[start][-1].reason.startswith("already started")
    assert outcome.violations == []


def _seeds_until(rule: str, sagas: int = 150) -> tuple[int, Outcome]:
    """How many seeds it takes to break ``rule``, and that run."""
    for seed in range(BUDGET):
        outcome = run(plans.generate(seed, sagas))
        if any(v.rule == rule for v in outcome.violations):
            first = outcome.violations[0]
            print(f"\nrule {rule} broken at seed {seed} ({seed + 1} seeds): {first}")
            return seed + 1, outcome
    pytest.fail(f"rule {rule} was never broken in {BUDGET} seeds: the simulation missed the bug")


@pytest.fixture
def old_give_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rule-2 race of 2026-12-06: the give-up of an irreversible step compensated the
    steps before it at once, and an abort did not settle the step in flight."""

    def give_up(state: SagaState, step: Step, reason: str, now: object) -> Transition:
        out: list[Outgoing] = []
        step = step.evolve(status="failed", landed_seq=state.landed_count + 1)
        state = land(state, step, now)  # type: ignore[arg-type]
        out.append(event(state, "step.failed", now, step, detail=reason))  # type: ignore[arg-type]
        if state.status == "running":
            state = begin_compensation(state, reason, now, out)  # type: ignore[arg-type]
        return Transition(advance(state, now, out), tuple(out))  # type: ignore[arg-type]

    monkeypatch.setattr(doubt, "into_doubt", give_up)
    monkeypatch.setattr(doubt, "settle_first", lambda state, step, now, out: state)


def test_the_rule_2_race_is_found(old_give_up: None) -> None:
    _, outcome = _seeds_until("2")
    assert "happened" in str(outcome.violations[0])


def test_a_failing_seed_shrinks_to_a_short_timeline(old_give_up: None) -> None:
    _, outcome = _seeds_until("2")
    small = shrink(outcome, budget=25)
    assert any(v.rule == "2" for v in small.violations)
    assert len(small.plan.sagas) < len(outcome.plan.sagas)
    told = report(small)
    assert small.violations[0].saga_id in told and "handled" in told
    again = run(small.plan)  # a shrunk plan replays as any plan does
    assert [str(v) for v in again.violations] == [str(v) for v in small.violations]


def test_a_requeue_without_a_block_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """The outage of 2026-11: a dropped pooled connection (``InternalClientError``) was not
    counted as the database being away, so a start failed, was requeued without the block that
    holds its order, and the order's next saga ran first (rule 6)."""
    errors = tuple(e for e in sql.TRANSIENT_DB_ERRORS if e.__name__ != "InternalClientError")
    monkeypatch.setattr(sql, "TRANSIENT_DB_ERRORS", errors)
    original = plans.generate

    def more_outages(seed: int, sagas: int, **kw: object) -> plans.Plan:
        p = original(seed, sagas, **kw)  # type: ignore[arg-type]
        outages = tuple(replace(f, kind="database") for f in p.faults)
        return replace(p, faults=outages)

    monkeypatch.setattr(plans, "generate", more_outages)
    _seeds_until("6")


def test_miscounted_attempts_are_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before the key record counted attempts, a batch's try was not counted when its request
    was re-run alone: a call that hung was made once more than the catalog allows."""
    claim = MemoryKeys._claim

    def uncounted(self: MemoryKeys, owner: str, c: object) -> Ticket:
        ticket = claim(self, owner, c)  # type: ignore[arg-type]
        if ticket.kind == "spent":  # only the process's own count stops it
            return Ticket("call", ticket.attempt + 1, owner=owner, lease_s=c.lease_s)  # type: ignore[attr-defined]
        return ticket

    monkeypatch.setattr(MemoryKeys, "_claim", uncounted)
    _seeds_until("attempts")


def test_a_silent_duplicate_start_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """A start sent again under a new message id was dropped as "already exists", unanswered."""

    def dropped(state: SagaState, command: StartSaga, plan: object, now: object) -> Transition:
        return ignored(state, f"saga {command.saga_id} already exists")

    monkeypatch.setattr(repeats, "start_again", dropped)
    _seeds_until("12")
