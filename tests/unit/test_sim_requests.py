"""Requests and outcomes travel as transient messages through classic queues
(``Topology.request_queue``, ``Topology.outcome_queue``): losing those queues at any instant,
with everything in them and in their consumers' hands, costs resends, never a saga. The
simulation runs one plan without such losses and again with them, and every saga must end the
same way."""

from __future__ import annotations

from dataclasses import replace

from saga_app.sim import plan as plans
from saga_app.sim.plan import Fault, Plan
from saga_app.sim.runner import Outcome, run


def _with_losses(plan: Plan, every_s: float) -> Plan:
    """``plan``, its request queues lost every ``every_s``: deleted (their node went down) and
    emptied (confirmed requests lost from a queue that survives), by turns."""
    losses: list[Fault] = []
    at = 0.7
    while at < plan.horizon_s + 20.0:
        kind = "deleted" if len(losses) % 2 == 0 else "emptied"
        losses.append(Fault(at, "queues", kind, 0.0))
        at += every_s
    return replace(plan, faults=tuple(sorted(plan.faults + tuple(losses), key=lambda f: f.at)))


def _ends(outcome: Outcome) -> dict[str, str | None]:
    world = outcome.world
    return {s.saga_id: getattr(world.saga(s.saga_id), "status", None) for s in world.plan.sagas}


def _lost_requests(outcome: Outcome) -> set[str | None]:
    t = outcome.world.topology
    return {e.message_id for e in outcome.world.broker.trace
            if e.kind in ("lost", "dropped") and t.is_request_queue(e.queue)}  # fmt: skip


def _lost_outcomes(outcome: Outcome) -> set[str | None]:
    t = outcome.world.topology
    return {e.message_id for e in outcome.world.broker.trace
            if e.kind in ("lost", "dropped") and t.is_outcome_queue(e.queue)}  # fmt: skip


def _through_outcome_queues(outcome: Outcome) -> int:
    t = outcome.world.topology
    return sum(1 for e in outcome.world.broker.trace
               if e.kind == "enqueue" and t.is_outcome_queue(e.queue))  # fmt: skip


def test_losing_every_request_queue_again_and_again_costs_resends_never_a_saga() -> None:
    plan = plans.generate(5, 200, faults=False)
    calm, lossy = run(plan), run(_with_losses(plan, every_s=0.9))

    assert calm.violations == [] and lossy.violations == []
    assert _ends(lossy) == _ends(calm)
    assert set(_ends(calm).values()) >= {"completed"}
    # The losses hit requests, which the register sent again.
    assert len(_lost_requests(lossy)) >= 5
    resent = sum(step.sends - 1 for s in plan.sagas
                 if (state := lossy.world.saga(s.saga_id)) for step in state.steps)  # fmt: skip
    assert resent >= len(_lost_requests(lossy)) // 2
    assert _lost_requests(calm) == set()
    # Outcomes went through the outcome queues, and losses took some of them too: the
    # coordinators' watch sent their requests again, the key records answered again.
    assert _through_outcome_queues(calm) >= len(plan.sagas)
    assert len(_lost_outcomes(lossy)) >= 1
    assert _lost_outcomes(calm) == set()


def test_request_queue_losses_among_every_other_fault_keep_every_rule() -> None:
    """Crashes, freezes, the broker and the database failing, systems failing, and the
    request queues lost besides."""
    outcomes_lost = 0
    for seed in range(3):
        outcome = run(_with_losses(plans.generate(100 + seed, 150), every_s=2.5))
        assert outcome.violations == [], (seed, outcome.violations[:3])
        assert _lost_requests(outcome)
        outcomes_lost += len(_lost_outcomes(outcome))
    assert outcomes_lost  # an outcome waits far less than a request: fewer are caught
