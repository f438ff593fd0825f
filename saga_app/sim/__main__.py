"""``python -m saga_app.sim``: simulate many sagas with faults, deterministically, and say which
seeds broke a rule; ``--seed N --shrink`` replays one seed, shrinks it and prints its timeline.

    python -m saga_app.sim --sagas 1000000 --per-run 500 --workers 2   # the long run
    python -m saga_app.sim --seed 1234 --per-run 500 --shrink          # one failing seed
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from saga_app.sim.plan import generate
from saga_app.sim.runner import report, run, shrink, sweep


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m saga_app.sim", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--sagas", type=int, default=10_000, help="sagas in all (default 10000)")
    parser.add_argument("--per-run", type=int, default=500, help="sagas per seed (default 500)")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--seed", type=int, help="replay this one seed and print its timeline")
    parser.add_argument("--shrink", action="store_true", help="with --seed: shrink it first")
    parser.add_argument("--json", action="store_true", help="the summary as JSON")
    args = parser.parse_args(argv)
    if args.seed is not None:
        outcome = run(generate(args.seed, args.per_run))
        if outcome.ok:
            print(f"seed {args.seed}: every rule held ({dict(outcome.statuses)})")
            return 0
        if args.shrink:
            outcome = shrink(outcome, log=lambda line: print(line, file=sys.stderr))
        print(report(outcome))
        return 1
    runs = max(1, args.sagas // args.per_run)
    seeds = range(args.first_seed, args.first_seed + runs)

    def progress(seed: int, count: int, first: str | None) -> None:
        if first is not None:
            print(f"seed {seed}: {first}", file=sys.stderr, flush=True)

    summary = sweep(seeds, args.per_run, workers=args.workers, progress=progress)
    facts = {
        "sagas": summary.sagas, "seeds": [seeds.start, seeds.stop - 1],
        "seconds": round(summary.wall_s, 1), "sagas_per_second": round(summary.rate, 1),
        "workers": args.workers, "failing_seeds": summary.failing,
    }  # fmt: skip
    if args.json:
        print(json.dumps(facts, indent=2))
    else:
        print(f"{summary.sagas} sagas over {runs} seeds in {summary.wall_s:.1f}s "
              f"({summary.rate:.0f} sagas/s, {args.workers} workers): "
              f"{len(summary.failing)} failing seed(s) {sorted(summary.failing)}")  # fmt: skip
    return 1 if summary.failing else 0


if __name__ == "__main__":
    sys.exit(main())
