"""The latency timeline's reading of packets: one saga at concurrency 1 becomes the chain of
broker hops, statements and each process's turns, and the segments add up to its latency."""

from __future__ import annotations

import pytest

from benchmarks.timeline import BROKER, DATABASE, packets, segments, server_ports, summary
from saga_shared.config import Settings

PORTS = {5672: BROKER, 5432: DATABASE}
OWNERS = {40001: "coordinator-0", 40002: "adapters"}  # the agent's port (40000) is nobody's
PORT_OF = {"agent": 40000, "coordinator-0": 40001, "adapters": 40002, BROKER: 5672, DATABASE: 5432}

# (ms, from, to, bytes): a start, a request and its outcome, and the final event
CHAIN = [
    (0.0, "agent", BROKER, 550),  # the agent publishes saga.start
    (0.6, BROKER, "agent", 21),  # its confirm
    (0.7, BROKER, "coordinator-0", 596),
    (1.5, "coordinator-0", DATABASE, 4797),
    (2.4, DATABASE, "coordinator-0", 140),
    (2.7, "coordinator-0", BROKER, 1048),  # the request
    (3.5, BROKER, "adapters", 597),
    (3.6, "coordinator-0", BROKER, 0),  # a bare TCP ack: no payload
    (3.9, "adapters", DATABASE, 246),
    (4.5, DATABASE, "adapters", 102),
    (4.9, "adapters", BROKER, 564),  # the outcome
    (5.6, BROKER, "coordinator-0", 610),
    (5.7, "adapters", BROKER, 21),  # the request's ack
    (5.8, BROKER, "adapters", 8),  # a heartbeat
    (6.5, "coordinator-0", DATABASE, 7303),
    (7.4, DATABASE, "coordinator-0", 128),
    (7.7, "coordinator-0", BROKER, 3259),  # the final event
    (8.0, BROKER, "agent", 3283),
]


def tcpdump_lines() -> list[str]:
    lines = []
    for ms, source, target, size in CHAIN:
        at = 1_765_000_000_000_000 + round(ms * 1000)  # microseconds
        lines.append(f"{at // 1_000_000}.{at % 1_000_000:06d} IP 127.0.0.1.{PORT_OF[source]} > "
                     f"127.0.0.1.{PORT_OF[target]}: Flags [P.], seq 1:{size + 1}, ack 1, win 512, "
                     f"length {size}")  # fmt: skip
    return ["reading from file saga.pcap, link-type EN10MB (Ethernet)", *lines]


def test_one_saga_splits_into_hops_statements_and_turns() -> None:
    found = segments(packets(tcpdump_lines(), OWNERS, PORTS))
    rounded = {name: [round(ms, 3) for ms in values] for name, values in found.items()}
    assert rounded == {
        "broker: agent to coordinator-0": [0.7],
        "coordinator-0: delivery to statement": [0.8, 0.9],
        "database: coordinator-0 statement": [0.9, 0.9],
        "coordinator-0: reply to publish": [0.3, 0.3],
        "broker: coordinator-0 to adapters": [0.8],
        "adapters: delivery to statement": [0.4],
        "database: adapters statement": [0.6],
        "adapters: reply to publish": [0.4],
        "broker: adapters to coordinator-0": [0.7],
        "broker: coordinator-0 to agent": [0.3],
    }
    # At concurrency 1 nothing overlaps: the segments are the whole latency.
    assert sum(map(sum, found.values())) == 8.0


def test_the_summary_gives_each_segment_per_saga() -> None:
    found = {"broker: agent to coordinator-0": [0.7, 0.9], "database: x": [1.0, 1.0, 1.0, 1.0]}
    report = summary(found, [10.0, 12.0])
    assert report["p50_ms"] == pytest.approx(11.0)
    assert report["segments"] == {
        "broker: agent to coordinator-0": {
            "per_saga": 1.0, "median_ms": pytest.approx(0.8), "ms_per_saga": pytest.approx(0.8),
        },
        "database: x": {"per_saga": 2.0, "median_ms": 1.0, "ms_per_saga": 2.0},
    }  # fmt: skip


def test_every_node_of_a_cluster_is_a_server_port() -> None:
    settings = Settings.from_env().with_(
        amqp_url="amqps://u:p@10.0.0.1:5671,10.0.0.2:5674/vh",
        database_url="postgresql://u@db1,db2:5433/saga",
    )
    assert server_ports(settings) == {5671: BROKER, 5674: BROKER, 5432: DATABASE, 5433: DATABASE}
