"""The benchmark report's targets: the ratios to the peer are taken at concurrency 64 and with
each side at its best rate, whatever concurrency that was, and every figure comes from the runs
it names."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from benchmarks.commands import Accepted, pooled
from benchmarks.harness import Plan, Result
from benchmarks.report import Findings, issue41_table, markdown, targets_table
from tests.chaos.cluster_speed import ClusterSpeed


def ours(concurrency: int, rate: float, cpu: float) -> Result:
    sagas = 1000
    return Result(
        plan=Plan(sagas, concurrency, mix="refund"), seconds=sagas / rate,
        latencies_ms=[10.0] * sagas, outcomes={"saga.completed": sagas}, messages_per_saga=9.0,
        transactions_per_saga=1.0, cpu_ms_per_saga={"coordinator-0": cpu, "load": 9.9},
        quorum_messages_per_saga=7.0,
    )  # fmt: skip


@dataclass
class Peer:
    concurrency: int
    processes: int
    rate: float
    name: str = "DBOS"
    latencies_ms: list[float] = field(default_factory=lambda: [5.0])
    outcomes: dict[str, int] = field(default_factory=dict)
    transactions_per_saga: float = 19.0
    cpu_ms_per_saga: float = 10.0
    postgres_cpu_ms_per_saga: float = 2.0

    def percentile(self, p: float) -> float:
        return 5.0


def row(lines: list[str], start: str) -> list[str]:
    found = [line for line in lines if line.startswith(f"| {start}")]
    assert len(found) == 1, (start, lines)
    return [cell.strip() for cell in found[0].strip("|").split("|")]


def test_the_peer_ratios_at_64_and_with_each_side_at_its_best() -> None:
    runs = [ours(1, 50.0, 20.0), ours(64, 300.0, 5.5), ours(256, 420.0, 4.0)]
    peers = [Peer(16, 1, 100.0), Peer(64, 1, 85.0), Peer(16, 2, 210.0), Peer(64, 2, 180.0)]
    findings = Findings(5000.0, 3, [runs[1]], ours_refund=runs, peer=peers)

    lines = targets_table(findings)

    assert row(lines, "x DBOS in 2 process(es), concurrency 64")[2:] == ["1.67x", "**no**"]
    at_best = row(lines, "x DBOS in 2 process(es), each at its best")
    assert "ours: concurrency 256, 420.0 sagas/s; DBOS: concurrency 16, 210.0" in at_best[0]
    assert at_best[2:] == ["2.00x", "yes"]
    assert row(lines, "x DBOS in 1 process(es), each at its best")[2:] == ["4.20x", "yes"]
    # CPU without the agents' load, at 64 and at the best rate
    assert row(lines, "CPU per refund saga, all processes (concurrency 64)")[2:] == [
        "5.5 ms", "**no**"
    ]  # fmt: skip
    assert row(lines, "CPU per refund saga, all processes (concurrency 256)")[2:] == [
        "4.0 ms", "yes"
    ]  # fmt: skip
    assert row(lines, "efficiency, refund sagas (concurrency 256)")[2] == "0.59"


def test_commands_accepted_pools_its_rounds_and_shows_each() -> None:
    # 5,000 in 2.5 s and 5,000 in 1.5 s: 10,000 in 4 s, not the mean of 2,000 and 3,333
    rounds = [Accepted(5000, 1, 0.3, 2.4, 2.5), Accepted(5000, 1, 0.3, 1.4, 1.5)]
    findings = Findings(5000.0, 3, [ours(64, 300.0, 5.5)], accepted=[pooled(rounds)])

    cells = row(targets_table(findings), "commands accepted (10,000 gated starts, 1 coordinator")

    assert cells[2:] == ["2,500/s (rounds: 2,000 / 3,333)", "yes"]


def test_issue_41s_targets_come_from_the_refunds_beside_the_peer() -> None:
    """p50 at 1 against 10 ms and 0.75x one-process DBOS's; the rate at 64 against 5x one
    process and 3x as many as cores; CPU at 64 against 3 ms, RabbitMQ's part against 0.6 ms."""
    one, busy = ours(1, 50.0, 20.0), ours(64, 300.0, 2.5)
    busy.cpu_ms_per_saga["rabbitmq"] = 0.7
    peers = [Peer(1, 1, 60.0), Peer(64, 1, 55.0), Peer(64, 2, 110.0)]
    lines = issue41_table(Findings(5000.0, 3, [busy], ours_refund=[one, busy], peer=peers))

    assert row(lines, "p50 at concurrency 1 |")[2:] == ["10.0 ms", "yes"]
    assert row(lines, "p50 at concurrency 1 / DBOS's (5.0 ms)")[2:] == ["2.00x", "**no**"]
    assert row(lines, "x DBOS in 1 process(es) at concurrency 64")[2:] == ["5.45x", "yes"]
    assert row(lines, "x DBOS in 2 process(es) at concurrency 64")[2:] == ["2.73x", "**no**"]
    assert row(lines, "CPU per saga at concurrency 64")[2:] == ["3.20 ms", "**no**"]
    assert row(lines, "of it RabbitMQ's")[2:] == ["0.70 ms", "**no**"]
    assert row(lines, "on the three-node cluster")[3] == "-"


def test_the_cluster_ratio_pools_its_rounds_and_names_how_the_nodes_ran() -> None:
    """The cluster's mean rate over the single node's, against 0.9x; not measured without it."""
    speed = ClusterSpeed(1000, 64, single=(150.0, 130.0), cluster=(120.0, 132.0),
                         leaders=("5/5/5", "5/5/5"), erl_args="+sbwt none")  # fmt: skip
    lines = issue41_table(Findings(5000.0, 3, [ours(64, 300.0, 2.5)], cluster=speed))

    cells = row(lines, "on the three-node cluster")
    assert cells[2:] == ["0.90x", "yes"]
    assert "150.0:120.0 / 130.0:132.0" in cells[0] and "5/5/5" in cells[0]
    assert "`+sbwt none`" in cells[0]
    slower = replace(speed, cluster=(100.0, 100.0))
    lines = issue41_table(Findings(5000.0, 3, [ours(64, 300.0, 2.5)], cluster=slower))
    assert row(lines, "on the three-node cluster")[2:] == ["0.71x", "**no**"]


def test_the_embedded_default_is_reported_apart_with_its_own_targets() -> None:
    """The in-process hand-off's runs get issue 41's table of their own (no cluster row), and
    the targets above stay the processes' figures."""
    one, busy = ours(1, 50.0, 20.0), ours(64, 300.0, 5.0)
    alone = [
        replace(ours(1, 70.0, 12.0), plan=Plan(1000, 1, mix="refund", embedded=True)),
        replace(ours(64, 330.0, 2.9), plan=Plan(1000, 64, mix="refund", embedded=True)),
    ]
    peers = [Peer(1, 1, 60.0), Peer(64, 1, 55.0), Peer(64, 2, 110.0)]
    findings = Findings(5000.0, 3, [busy], ours_refund=[one, busy], peer=peers, embedded=alone)

    text = markdown(findings, [])
    section = text.split("## Issue 41's targets on the embedded default, apart")[1]
    apart = section.split("## Targets of issue 10")[0].splitlines()

    assert row(apart, "x DBOS in 1 process(es) at concurrency 64")[2:] == ["6.00x", "yes"]
    assert row(apart, "CPU per saga at concurrency 64")[2:] == ["2.90 ms", "yes"]
    assert not [line for line in apart if "three-node cluster" in line]
    assert row(issue41_table(findings), "x DBOS in 1 process(es) at concurrency 64")[2] == "5.45x"
    assert row(text.splitlines(), "refund, embedded | 1000 | 64")[5] == "**330.0**"
