"""``python -m benchmarks [--sagas N] [--concurrency C ...] [--smoke]``"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from benchmarks.harness import Result, report, run_benchmark, summary_line
from shared.config import Settings


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks")
    parser.add_argument("--sagas", type=int, default=500)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--coordinators", type=int, default=1)
    parser.add_argument("--ceiling-messages", type=int, default=20000)
    parser.add_argument("--out", default="benchmarks/results/report.md")
    parser.add_argument("--smoke", action="store_true", help="a few sagas, no report")
    args = parser.parse_args()
    settings = Settings.from_env()
    if args.smoke:
        result = asyncio.run(run_benchmark(settings, 6, 3, 1, 500))
        print(summary_line(result))
        if sum(result.outcomes.values()) != 6:
            raise SystemExit("smoke benchmark: not every saga finished")
        return
    results: list[Result] = []
    for i, concurrency in enumerate(args.concurrency):
        ceiling = args.ceiling_messages if i == 0 else 0
        result = asyncio.run(
            run_benchmark(settings, args.sagas, concurrency, args.coordinators, ceiling)
        )
        if results:  # one ceiling measurement serves the whole run
            result.ceiling_msgs_per_s = results[0].ceiling_msgs_per_s
        print(summary_line(result))
        results.append(result)
    Path(args.out).write_text(report(results))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
