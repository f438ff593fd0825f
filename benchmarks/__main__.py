"""``python -m benchmarks``: the whole measurement (ceiling, concurrency sweep, 1 versus 2
coordinators, commands accepted, the DBOS peer, growth with stored sagas), then the report and
plots.
``--smoke`` runs a few sagas only, to keep the harness working in CI."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.ceiling import broker_ceiling
from benchmarks.commands import Accepted, commands_accepted
from benchmarks.commands import pooled as pooled_accepted
from benchmarks.harness import (
    RUN_DEPTH,
    Plan,
    Result,
    pooled,
    run_benchmark,
    run_growth,
    sagas_for,
)
from benchmarks.report import BUSY, Findings, PeerRun, write
from saga_shared import loop
from saga_shared.config import Settings


def _line(r: Result) -> str:
    p = r.plan
    return (f"{p.mix} x{p.sagas} c={p.concurrency} coordinators={p.coordinators} "
            f"identity={p.identity}{' embedded' if p.embedded else ''} "
            f"stored={p.preload:,}: {r.rate:.1f} sagas/s, p50 {r.percentile(50):.1f} ms, "
            f"p99 {r.percentile(99):.1f} ms, {r.messages_per_saga:.1f} msgs/saga, "
            f"{r.transactions_per_saga:.1f} tx/saga, {r.cpu_ms:.1f} CPU ms/saga, "
            f"{r.wal_bytes_per_saga / 1024:.1f} kB WAL/saga, {r.outcomes}")  # fmt: skip


def _finished(result: Result) -> Result:
    print(_line(result), flush=True)
    if sum(result.outcomes.values()) != result.plan.sagas:
        raise SystemExit(f"not every saga finished: {result.outcomes}")
    return result


async def _run(settings: Settings, plan: Plan) -> Result:
    return _finished(await run_benchmark(settings, plan))


def _at_least(low: int) -> Callable[[str], int]:
    """An argument type: a whole number of at least ``low``, named in argparse's error."""

    def whole(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number, not {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be {low} or more, not {value}")
        return value

    return whole


async def measure(settings: Settings, args: argparse.Namespace) -> Findings:
    processes = max(args.coordinators) + 2  # coordinators, the adapters, the agents' load
    ceiling = await broker_ceiling(settings.amqp_url, args.ceiling_messages, processes)
    print(f"raw broker ceiling: {ceiling:.0f} msgs/s from {processes} processes", flush=True)
    busiest = max(args.concurrency)
    sweep = [
        await _run(
            settings,
            Plan(
                sagas_for(args.sagas, c),
                c,
                profile=c == busiest and not args.no_profile,
                identity=args.identity,
            ),
        )
        for c in args.concurrency
    ]
    base = Plan(sagas_for(args.sagas, busiest), busiest, identity=args.identity)
    findings = Findings(ceiling, processes, sweep)
    for n in args.coordinators:
        if n != 1:
            findings.scaling.append(await _run(settings, replace(base, coordinators=n)))
    findings.accepted = await _commands(settings, args) if args.commands else []
    findings.ours_refund, findings.peer, findings.embedded = await _side_by_side(settings, args)
    if args.cluster_rounds:  # disposable nodes of its own, so before the preload's writes
        from tests.chaos.cluster_speed import compare

        # On a loop of its own, asyncio's: under uvloop the disposable Postgres's `pg_ctl start`
        # never gave its output's end (its server kept the pipe), and the run stopped there.
        findings.cluster = await asyncio.to_thread(
            asyncio.run, compare(sagas_for(args.sagas, busiest), busiest, args.cluster_rounds)
        )
        print(f"cluster: {findings.cluster.ratio:.2f}x the single node", flush=True)
    # Last: the preload leaves gigabytes of dirty pages and WAL that Postgres writes out for
    # minutes after, which would slow every measurement behind it (the growth run's own rounds
    # alternate, so both of its sides share that).
    if args.stored:
        findings.growth = await run_growth(
            settings, args.sagas, [1, busiest], args.stored, args.rounds
        )
        for pair in findings.growth:
            for result in pair:
                _finished(result)
    return findings


async def _commands(settings: Settings, args: argparse.Namespace) -> list[Accepted]:
    """Commands accepted, with each coordinator count in turn, round after round, pooled."""
    runs: dict[int, list[Accepted]] = {n: [] for n in args.coordinators}
    for _ in range(args.rounds):
        for n, mine in runs.items():
            a = await commands_accepted(settings, args.commands, n)
            print(f"commands accepted, {n} coordinator(s): {a.commands} in {a.seconds:.2f} s "
                  f"(in the register in {a.registered_seconds:.2f}), {a.rate:.0f}/s",
                  flush=True)  # fmt: skip
            mine.append(a)
    return [pooled_accepted(mine) for mine in runs.values()]


async def _side_by_side(
    settings: Settings, args: argparse.Namespace
) -> tuple[list[Result], list[PeerRun], list[Result]]:
    """Refunds on this stack and on the DBOS peer (in one process, and in as many as there
    are cores), in alternating rounds so a change in the machine's load hits both, pooled;
    with ``--embedded``, at 1 and 64 also in one process with the in-process hand-off."""
    cores = os.cpu_count() or 1
    if not args.no_peer:  # DBOS is the bench extra's
        from benchmarks.peer_dbos import pooled as pooled_peer
        from benchmarks.peer_dbos import run_dbos_processes
    ours: list[Result] = []
    peers: list[PeerRun] = []
    embedded: list[Result] = []
    for c in args.peer_concurrency:
        mine: list[Result] = []
        alone: list[Result] = []
        theirs: dict[int, list[Any]] = {n: [] for n in sorted({1, min(cores, c)})}
        sagas = sagas_for(args.sagas, c)
        for _ in range(args.rounds):
            plan = Plan(sagas, c, mix="refund", identity=args.identity)
            mine.append(await _run(settings, plan))
            if args.embedded and c in (1, BUSY):  # shared identity: the hand-off's only
                alone.append(await _run(settings, replace(plan, identity="shared", embedded=True)))
            for n, runs in ({} if args.no_peer else theirs).items():
                peer = await run_dbos_processes(settings.database_url, sagas, c, n)
                print(f"{peer.name} x{n} c={c}: {peer.rate:.1f} sagas/s, "
                      f"p50 {peer.percentile(50):.1f} ms", flush=True)  # fmt: skip
                runs.append(peer)
        ours.append(pooled(mine))
        embedded += [pooled(alone)] if alone else []
        peers += [pooled_peer(runs) for runs in theirs.values() if runs]
    return ours, peers, embedded


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks")
    parser.add_argument(
        "--sagas", type=_at_least(1), default=1000,
        help=f"sagas per run (at least {RUN_DEPTH} per saga in flight)",
    )  # fmt: skip
    parser.add_argument("--concurrency", type=_at_least(1), nargs="+",
                        default=[1, 4, 16, 64, 256])  # fmt: skip
    parser.add_argument("--coordinators", type=_at_least(1), nargs="+", default=[1, 2])
    parser.add_argument("--stored", type=_at_least(0), default=1_000_000,
                        help="finished sagas stored for the growth run (0: none)")  # fmt: skip
    parser.add_argument("--peer-concurrency", type=_at_least(1), nargs="*",
                        default=[1, 16, 64, 256],
                        help="refunds beside DBOS at these; ratios at 1, 64 and each side's "
                             "best")  # fmt: skip
    parser.add_argument(
        "--rounds",
        type=_at_least(1),
        default=2,
        help="alternating rounds: beside DBOS, empty versus stored sagas, commands with "
        "each coordinator count",
    )
    parser.add_argument("--commands", type=_at_least(0), default=5000,
                        help="gated starts for the commands-accepted rate (0: skip)")  # fmt: skip
    parser.add_argument("--no-peer", action="store_true", help="skip DBOS (no bench extra)")
    parser.add_argument(
        "--embedded", action=argparse.BooleanOptionalAction, default=True,
        help="beside DBOS at 1 and 64, refunds also in one process with the in-process "
        "hand-off (SAGA_HANDOFF=in-process), reported apart",
    )  # fmt: skip
    parser.add_argument(
        "--cluster-rounds", type=_at_least(0), default=3,
        help="refunds at the busiest concurrency on a disposable node and on a disposable "
        "three-node cluster, alternating, this many rounds (0: skip)",
    )  # fmt: skip
    parser.add_argument(
        "--identity", choices=["shared", "roles"], default="shared",
        help="roles: every process on its own account, in a vhost of the run's (the sweep and "
        "the peer comparison; commands accepted and growth stay shared)",
    )  # fmt: skip
    parser.add_argument("--no-profile", action="store_true", help="no py-spy sampling")
    parser.add_argument("--ceiling-messages", type=_at_least(1), default=30000)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--smoke", action="store_true", help="a few sagas, no report")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    settings = Settings.from_env()
    if args.smoke:
        loop.run(_run(settings, Plan(6, 3, identity=args.identity)))
        return
    findings = loop.run(measure(settings, args))
    print(f"wrote {write(findings, args.out)}")


if __name__ == "__main__":
    main()
