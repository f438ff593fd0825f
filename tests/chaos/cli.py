"""``python -m tests.chaos``: the big chaos run, and re-checking a kept run."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from tests.chaos.harness import ChaosConfig, reverify, run_chaos


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tests.chaos",
        description="Sagas with injected faults on a disposable broker and database while every "
        "process is killed at random; then every rule of the design "
        "(docs/explanation/design.md) is checked.",
    )
    parser.add_argument("--sagas", type=int, default=1000)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--rate", type=float, default=25.0, help="sagas published per second")
    parser.add_argument(
        "--kill-every", type=float, default=3.0, help="mean seconds between kills; 0: none"
    )
    each = "default: one per two minutes of load, at least 1"
    parser.add_argument("--broker-restarts", type=int, help=each)
    parser.add_argument("--db-restarts", type=int, help=each)
    down = "seconds down (between half this and this)"
    parser.add_argument("--broker-down", type=float, default=3.0, help=down)
    parser.add_argument("--db-down", type=float, default=3.0, help=down)
    parser.add_argument("--settle-timeout", type=float, default=300.0)
    parser.add_argument(
        "--freeze",
        type=float,
        default=40.0,
        help="seconds one adapter hangs (SIGSTOP), at least; always longer than its longest "
        "answer window; 0: none",
    )
    parser.add_argument(
        "--freeze-coordinator", type=float, default=30.0, metavar="SECONDS",
        help="one coordinator hangs (SIGSTOP) this long in the load, while it owns half the "
        "partitions; 0: none",
    )  # fmt: skip
    parser.add_argument("--no-faults", action="store_true")
    parser.add_argument(
        "--cluster", action="store_true",
        help="three RabbitMQ nodes (a broker crash kills the leader of most partitions) and a "
        "Postgres primary with a synchronous standby (the first database crash fails over)",
    )  # fmt: skip
    parser.add_argument(
        "--embedded", action="store_true",
        help="two `saga run all` processes with the in-process hand-off (SAGA_HANDOFF), each "
        "owning half the partitions, instead of a process per coordinator and adapter",
    )  # fmt: skip
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--reverify", type=Path, metavar="RUN_DIR", help="check a kept run again")
    return parser


def config_from(args: argparse.Namespace) -> ChaosConfig:
    window = args.sagas / args.rate
    per_window = max(1, round(window / 120))  # one of each per two minutes of load
    return ChaosConfig(
        sagas=args.sagas,
        seed=args.seed,
        rate=args.rate,
        kill_every_s=args.kill_every or None,
        broker_restarts=args.broker_restarts if args.broker_restarts is not None else per_window,
        db_restarts=args.db_restarts if args.db_restarts is not None else per_window,
        broker_down_s=args.broker_down,
        db_down_s=args.db_down,
        settle_timeout_s=args.settle_timeout,
        freeze_s=args.freeze,
        freeze_coordinator_s=args.freeze_coordinator,
        with_faults=not args.no_faults,
        workdir=args.workdir,
        cluster=args.cluster,
        embedded=args.embedded,
    )


def main(argv: list[str] | None = None) -> int:
    """Exit 0 when every rule held, 1 on any violation."""
    args = _parser().parse_args(argv)
    if args.reverify is not None:
        return 0 if asyncio.run(reverify(args.reverify)).ok else 1
    result = asyncio.run(run_chaos(config_from(args)))
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
