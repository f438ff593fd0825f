"""The checker checked: a green chaos run means something only if ``verify`` does catch each kind
of violation. A fabricated database that keeps every rule passes; each test breaks one rule in it
and expects exactly that rule to be reported. Pure, no services."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from saga_shared.config import Settings
from saga_shared.model.gateway import load_catalog
from tests.chaos.checks import (
    RESULT_ID,
    UNDONE,
    Effect,
    Observed,
    SagaRecord,
    StepRecord,
    verify,
)
from tests.chaos.load import Load, LoadShape, PlannedSaga, PlanStep, expect, plan_load, saga_plans


@pytest.fixture(scope="module")
def load() -> Load:
    plans = saga_plans(load_catalog(Settings().catalog_file))
    return plan_load(LoadShape(sagas=400), plans, random.Random(7))


class PerfectRun:
    """The database a perfect run leaves behind: every saga ends as its injected faults say,
    one saga of an order after the other, compensations in reverse order."""

    def __init__(self, load: Load, *, fenced: bool = False) -> None:
        self.load = load
        # Every failure of unknown effect found out by a settle: nothing landed (a fenced key).
        self.fenced = fenced
        self.now = datetime(2026, 1, 1, tzinfo=UTC)
        self.seen = Observed({}, [], {}, {}, [], [], [], [], 0)
        for sagas in load.orders.values():
            holder: str | None = None
            for saga in sagas:
                if holder is None:
                    self.run(saga)
                    if self.seen.sagas[saga.saga_id].status == "needs_human":
                        holder = saga.saga_id
                else:
                    self.wait(saga, holder)

    def tick(self) -> datetime:
        self.now += timedelta(milliseconds=10)
        return self.now

    def run(self, saga: PlannedSaga) -> None:
        want = expect(saga, self.load)
        plan = self.load.plans[saga.kind]
        fail = len(plan) if want.failing_step is None else want.failing_step
        steps = [self.forward(saga, step, landed=i + 1) for i, step in enumerate(plan[:fail])]
        status = "completed"
        if fail < len(plan):
            unknown = want.effect_unknown and not self.fenced
            landed = fail + 1 if unknown else None
            failed = _step(plan[fail], "failed", self.tick(), self.tick(), landed)
            steps.append(dataclasses.replace(failed, effect_unknown=unknown))
            steps += [_step(s, "skipped", None, None, None) for s in plan[fail + 1 :]]
            status = self.compensate(saga, plan, steps)
        self.seen.sagas[saga.saga_id] = SagaRecord(
            saga_id=saga.saga_id,
            order_id=saga.order_id,
            kind=saga.kind,
            status=status,
            arrival=len(self.seen.sagas) + 1,
            finished_at=None if status == "needs_human" else self.tick(),
            waiting_for=None,
            reason=None,
            needs_human_reason=None,
            steps=tuple(steps),
        )

    def wait(self, saga: PlannedSaga, holder: str) -> None:
        """Rule 6: behind a needs_human saga of its order, a saga waits and never starts."""
        self.seen.holders[saga.order_id] = holder
        steps = tuple(_step(s, "pending", None, None, None) for s in self.load.plans[saga.kind])
        self.seen.sagas[saga.saga_id] = SagaRecord(
            saga_id=saga.saga_id,
            order_id=saga.order_id,
            kind=saga.kind,
            status="waiting",
            arrival=len(self.seen.sagas) + 1,
            finished_at=None,
            waiting_for=holder,
            reason=None,
            needs_human_reason=None,
            steps=steps,
        )

    def forward(self, saga: PlannedSaga, step: PlanStep, landed: int) -> StepRecord:
        started = self.tick()
        key = f"{saga.saga_id}:{step.action}"
        self.seen.idempotency[key] = ("done", self.now)
        result = {}
        if step.action in RESULT_ID:
            entity = f"{step.action}/{saga.saga_id}"
            self.seen.effects.append(Effect(step.action, saga.order_id, key, entity, self.now))
            self.seen.entity_status[entity] = "sent" if "email" in step.action else "active"
            result[RESULT_ID[step.action]] = entity
        return dataclasses.replace(_step(step, "done", started, self.tick(), landed), result=result)

    def compensate(
        self, saga: PlannedSaga, plan: tuple[PlanStep, ...], steps: list[StepRecord]
    ) -> str:
        failing = {a for a, f in self.load.faults_of(saga.order_id).items() if f.fails}
        for i in reversed(range(len(steps))):
            record, step = steps[i], plan[i]
            if not (step.compensable and record.may_have_landed):
                continue
            key = f"{saga.saga_id}:{step.compensation}"
            if step.compensation in failing:
                self.seen.idempotency[key] = ("failed", self.tick())
                steps[i] = dataclasses.replace(
                    record, status="compensation_failed", compensation_status="failed"
                )
                return "needs_human"
            self.seen.idempotency[key] = ("done", self.tick())
            entity = record.result.get(RESULT_ID[step.action])
            if isinstance(entity, str):
                self.seen.effects.append(
                    Effect(str(step.compensation), saga.order_id, key, entity, self.now)
                )
                self.seen.entity_status[entity] = UNDONE[step.action]
            steps[i] = dataclasses.replace(
                record,
                status="compensated",
                compensation_status="compensated",
                compensated_at=self.now,
            )
        return "compensated"


def _step(
    step: PlanStep,
    status: str,
    started: datetime | None,
    finished: datetime | None,
    landed: int | None,
) -> StepRecord:
    return StepRecord(
        index=step.index,
        action=step.action,
        action_class=step.action_class.value,
        status=status,
        effect_unknown=False,
        started_at=started,
        finished_at=finished,
        landed_seq=landed,
        compensation=step.compensation,
        compensation_status="none",
        compensated_at=None,
        result={},
        error=None,
        compensation_error=None,
    )


def rules_broken(load: Load, seen: Observed) -> set[str]:
    confirmed = {s.saga_id for s in load.sagas}
    return {v.rule for v in verify(load, seen, confirmed).violations}


def first(seen: Observed, status: str, test: Callable[[SagaRecord], bool] = bool) -> SagaRecord:
    return next(r for r in seen.sagas.values() if r.status == status and test(r))


def with_saga(seen: Observed, record: SagaRecord, **changes: object) -> None:
    seen.sagas[record.saga_id] = dataclasses.replace(record, **changes)  # type: ignore[arg-type]


# --- the perfect run passes, and is varied enough to exercise every check ------------------------


def test_a_perfect_run_breaks_no_rule(load: Load) -> None:
    seen = PerfectRun(load).seen
    verdict = verify(load, seen, {s.saga_id for s in load.sagas})

    assert verdict.violations == []
    assert set(verdict.terminal) == {"completed", "compensated", "needs_human", "waiting"}
    assert verdict.held == verdict.terminal["waiting"] > 0
    assert any(len(sagas) == 3 for sagas in load.orders.values())


def test_a_failure_found_not_to_have_landed_needs_no_way_back(load: Load) -> None:
    """A call killed mid-way, its attempts then spent: the adapter's settle fences the key and
    finds nothing landed, so the failing step is not compensated and a saga that would have
    stopped at its failing compensation ends compensated. That is found out, not guessed."""
    seen = PerfectRun(load, fenced=True).seen
    changed = [
        r for r in seen.sagas.values()
        if (want := expect(next(s for s in load.sagas if s.saga_id == r.saga_id), load))
        and want.if_not_landed is not None and r.status == want.if_not_landed != want.outcome
    ]  # fmt: skip

    assert changed, "the load has no failure of unknown effect whose way back fails"
    assert verify(load, seen, {s.saga_id for s in load.sagas}).violations == []


def test_a_failure_said_not_to_have_landed_while_it_did_breaks_rule_3(load: Load) -> None:
    seen = PerfectRun(load, fenced=True).seen
    record = first(seen, "compensated", lambda r: any(
        s.status == "failed" and s.action in RESULT_ID for s in r.steps
    ))  # fmt: skip
    step = next(s for s in record.steps if s.status == "failed")
    key = f"{record.saga_id}:{step.action}"
    seen.effects.append(Effect(step.action, record.order_id, key, "stray", datetime.now(UTC)))
    seen.entity_status["stray"] = "active"
    assert "3" in rules_broken(load, seen)


# --- each broken rule is reported ----------------------------------------------------------------


def test_a_lost_saga_breaks_rule_1(load: Load) -> None:
    seen = PerfectRun(load).seen
    del seen.sagas[load.sagas[0].saga_id]
    assert verify(load, seen, {s.saga_id for s in load.sagas}).lost == 1
    assert rules_broken(load, seen) == {"1"}


def test_a_saga_left_running_breaks_rule_1(load: Load) -> None:
    seen = PerfectRun(load).seen
    with_saga(seen, first(seen, "completed"), status="running")
    assert "1" in rules_broken(load, seen)


def test_completing_despite_a_permanent_fault_breaks_rule_1(load: Load) -> None:
    seen = PerfectRun(load).seen
    record = first(seen, "compensated")
    with_saga(seen, record, status="completed")
    assert "1" in rules_broken(load, seen)


def test_reporting_compensated_when_a_compensation_must_fail_breaks_the_rules(load: Load) -> None:
    seen = PerfectRun(load).seen
    with_saga(seen, first(seen, "needs_human"), status="compensated")
    assert {"1", "4"} <= rules_broken(load, seen)


def test_an_effect_applied_twice_breaks_rule_3(load: Load) -> None:
    seen = PerfectRun(load).seen
    seen.effects.append(seen.effects[0])
    assert verify(load, seen, set()).duplicated_effects == 1
    assert rules_broken(load, seen) == {"3"}


def test_an_entity_without_an_effect_breaks_rule_3(load: Load) -> None:
    seen = PerfectRun(load).seen
    seen.entity_status["res-stray"] = "active"
    assert rules_broken(load, seen) == {"3"}


def test_an_email_sent_for_a_compensated_saga_breaks_rule_2(load: Load) -> None:
    seen = PerfectRun(load).seen
    record = first(seen, "compensated")
    action = load.plans[record.kind][-1].action
    key = f"{record.saga_id}:{action}"
    seen.effects.append(Effect(action, record.order_id, key, "em-late", datetime.now(UTC)))
    seen.entity_status["em-late"] = "sent"
    assert "2" in rules_broken(load, seen)


def test_a_landed_effect_left_in_place_by_a_compensated_saga_breaks_rule_4(load: Load) -> None:
    seen = PerfectRun(load).seen
    undone = next(e for e in seen.effects if seen.entity_status[e.entity_id] in UNDONE.values())
    seen.entity_status[undone.entity_id] = "active"
    assert rules_broken(load, seen) == {"4"}


def test_compensating_a_step_that_certainly_failed_breaks_rule_4(load: Load) -> None:
    seen = PerfectRun(load).seen

    def certain_failure(r: SagaRecord) -> bool:
        return any(
            s.status == "failed" and not s.effect_unknown and s.compensation for s in r.steps
        )

    record = first(seen, "compensated", certain_failure)
    step = next(s for s in record.steps if s.status == "failed")
    seen.idempotency[f"{record.saga_id}:{step.compensation}"] = ("done", datetime.now(UTC))
    assert rules_broken(load, seen) == {"4"}


def test_compensating_in_landing_order_breaks_rule_4(load: Load) -> None:
    seen = PerfectRun(load).seen

    def two_undone(r: SagaRecord) -> bool:
        return sum(s.compensation_status == "compensated" for s in r.steps) >= 2

    record = first(seen, "compensated", two_undone)
    undone = [s for s in record.steps if s.compensation_status == "compensated"]
    a, b = undone[0], undone[1]
    swapped = {a.index: b.compensated_at, b.index: a.compensated_at}
    steps = tuple(
        dataclasses.replace(s, compensated_at=swapped[s.index]) if s.index in swapped else s
        for s in record.steps
    )
    with_saga(seen, record, steps=steps)
    assert rules_broken(load, seen) == {"4"}


def test_two_sagas_of_one_order_overlapping_breaks_rule_6(load: Load) -> None:
    seen = PerfectRun(load).seen
    order = next(sagas for sagas in load.orders.values() if len(sagas) >= 2)
    earlier = seen.sagas[order[0].saga_id]
    with_saga(seen, earlier, finished_at=datetime(2030, 1, 1, tzinfo=UTC))
    assert rules_broken(load, seen) == {"6"}


def test_sagas_of_one_order_arriving_out_of_publish_order_break_rule_6(load: Load) -> None:
    seen = PerfectRun(load).seen
    order = next(sagas for sagas in load.orders.values() if len(sagas) >= 2)
    a, b = seen.sagas[order[0].saga_id], seen.sagas[order[1].saga_id]
    with_saga(seen, a, arrival=b.arrival)
    with_saga(seen, b, arrival=a.arrival)
    assert "6" in rules_broken(load, seen)


def test_a_dead_letter_is_reported(load: Load) -> None:
    seen = PerfectRun(load).seen
    seen.dead_letters.append(
        {
            "id": 1,
            "message_type": "action.request",
            "order_id": load.sagas[0].order_id,
            "saga_id": load.sagas[0].saga_id,
            "source_queue": "chaos.action.erp",
            "reason": "delivery_limit",
            "error": "boom",
            "delivery_count": 6,
            "status": "dead",
        }
    )
    verdict = verify(load, seen, set())
    assert verdict.dead_letters == 1
    assert rules_broken(load, seen) == {"7/8"}


def test_a_message_applied_twice_breaks_rule_8(load: Load) -> None:
    seen = PerfectRun(load).seen
    seen.applied_twice.append(
        {"message_id": "m1", "message_type": "action.done", "order_id": "o", "saga_id": "s", "n": 2}
    )
    assert rules_broken(load, seen) == {"8"}


def test_an_email_sent_before_an_earlier_step_landed_breaks_rule_2(load: Load) -> None:
    seen = PerfectRun(load).seen
    record = first(seen, "completed")
    email = next(
        e for e in seen.effects if e.key.startswith(record.saga_id) and "email" in e.action
    )
    seen.effects.remove(email)
    seen.effects.append(dataclasses.replace(email, applied_at=datetime(2020, 1, 1, tzinfo=UTC)))
    assert rules_broken(load, seen) == {"2"}


def test_a_saga_that_ran_behind_a_needs_human_saga_breaks_rule_6(load: Load) -> None:
    seen = PerfectRun(load).seen
    record = first(seen, "waiting")
    started = dataclasses.replace(record.steps[0], started_at=datetime.now(UTC))
    with_saga(seen, record, steps=(started, *record.steps[1:]))
    assert rules_broken(load, seen) == {"6"}
