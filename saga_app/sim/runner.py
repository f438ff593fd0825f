"""Running a plan, bit for bit again from its seed; shrinking a failing plan to a short one that
still breaks the same rule (dropping sagas and faults while it does, as delta debugging does);
and telling a run as a readable timeline."""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import random
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

from saga_app.sim import loop
from saga_app.sim.checks import Violation, check
from saga_app.sim.plan import Plan, generate
from saga_app.sim.world import World
from saga_shared.model.ids import seeded
from saga_shared.model.messages import stamped_by


@dataclass
class Outcome:
    plan: Plan
    violations: list[Violation]
    statuses: Counter[str]
    virtual_s: float
    wall_s: float
    world: World

    @property
    def ok(self) -> bool:
        return not self.violations


@contextmanager
def _quiet() -> Iterator[None]:
    """The product logs every retry and redelivery: in a simulation of thousands that is
    noise (the timeline tells a failing run)."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        root.setLevel(level)


def run(plan: Plan) -> Outcome:
    """One run of ``plan``: the same plan gives the same run, event for event."""
    started = time.perf_counter()
    ids = random.Random(f"ids-{plan.seed}")
    with _quiet(), seeded(ids.randbytes), stamped_by(loop.now):
        world = World(plan)

        async def main() -> float:
            await world.run()
            return asyncio.get_running_loop().time()

        virtual = loop.run(main())
        violations = check(world)
    statuses: Counter[str] = Counter(str(s.status) for s in world.store.memory.sagas())
    return Outcome(plan, violations, statuses, virtual, time.perf_counter() - started, world)


def shrink(
    outcome: Outcome, *, budget: int = 60, log: Callable[[str], None] = lambda _: None
) -> Outcome:
    """A shorter plan that still breaks the first broken rule: parts of the plan are dropped,
    halves first, while the rule stays broken, within ``budget`` runs."""
    rule = outcome.violations[0].rule
    best = outcome
    runs = 0
    for field_name in ("sagas", "faults"):
        chunk = max(1, len(getattr(best.plan, field_name)) // 2)
        while chunk >= 1 and runs < budget:
            parts = list(getattr(best.plan, field_name))
            shrunk = False
            for start in range(0, len(parts), chunk):
                if runs >= budget:
                    break
                kept = tuple(parts[:start] + parts[start + chunk :])
                smaller = (replace(best.plan, sagas=kept) if field_name == "sagas"
                           else replace(best.plan, faults=kept))  # fmt: skip
                candidate = run(smaller)
                runs += 1
                if any(v.rule == rule for v in candidate.violations):
                    best, shrunk = candidate, True
                    log(f"shrunk to {len(best.plan.sagas)} sagas, {len(best.plan.faults)} faults")
                    break
            if not shrunk:
                chunk //= 2
    return best


def timeline(outcome: Outcome, saga_id: str | None = None) -> str:
    """The run as lines in virtual time: the processes' notes and every message handled
    (for one saga, with ``saga_id``)."""
    rec = outcome.world.records
    lines = [(t, who, what) for t, who, what in rec.timeline
             if saga_id is None or saga_id in what or who in ("world", "broker", "database")
             or "killed" in what or "frozen" in what or "thawed" in what]  # fmt: skip
    lines += [(t, "handled", f"{saga} {kind} {mid}: {note}")
              for t, saga, kind, mid, note in rec.handled
              if saga_id is None or saga == saga_id]  # fmt: skip
    lines.sort(key=lambda x: x[0])
    return "\n".join(f"{t:9.3f}s {who:>16}  {what}" for t, who, what in lines)


def report(outcome: Outcome) -> str:
    """A failing run: its seed, what broke, the shrunk plan's timeline for the first saga."""
    first = outcome.violations[0]
    saga = first.saga_id if first.saga_id.startswith("s-") else None
    plan = outcome.plan
    faults = ", ".join(
        f"{f.kind} {f.target} {f.point}".rstrip() + f" at {f.at:.1f}s for {f.for_s:.1f}s"
        for f in plan.faults
    )
    head = [
        f"seed {plan.seed}: {len(outcome.violations)} violation(s); the plan: "
        f"{len(plan.sagas)} sagas, {len(plan.faults)} faults ({faults})",
        *[f"  {v}" for v in outcome.violations[:10]],
        "",
    ]
    return "\n".join(head) + timeline(outcome, saga)


@dataclass(frozen=True)
class Summary:
    """Many runs: how many sagas, how long, and the seeds that broke a rule (with the first
    violation of each)."""

    sagas: int
    wall_s: float
    failing: dict[int, str]

    @property
    def rate(self) -> float:
        return self.sagas / self.wall_s if self.wall_s else 0.0


def _one(args: tuple[int, int]) -> tuple[int, int, str | None]:
    seed, sagas = args
    outcome = run(generate(seed, sagas))
    return seed, sagas, (str(outcome.violations[0]) if outcome.violations else None)


def sweep(
    seeds: range, sagas: int, *, workers: int = 1,
    progress: Callable[[int, int, str | None], None] | None = None,
) -> Summary:  # fmt: skip
    """Run ``sagas`` sagas with faults for each seed, over ``workers`` processes (each run is
    one thread and deterministic; the processes only share the work)."""
    started = time.perf_counter()
    failing: dict[int, str] = {}
    total = 0
    jobs = [(seed, sagas) for seed in seeds]
    results: Iterator[tuple[int, int, str | None]]
    if workers > 1:
        pool = multiprocessing.get_context("fork").Pool(workers)
        results = pool.imap_unordered(_one, jobs)
    else:
        pool, results = None, map(_one, jobs)
    try:
        for seed, count, first in results:
            total += count
            if first is not None:
                failing[seed] = first
            if progress is not None:
                progress(seed, count, first)
    finally:
        if pool is not None:
            pool.close()
            pool.join()
    return Summary(total, time.perf_counter() - started, failing)
