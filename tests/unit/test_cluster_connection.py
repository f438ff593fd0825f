"""Where a connection to a cluster starts: a different node per process (and per connection of
one process), then, whenever the node in use goes away, the others in turn, the next first.
No broker: aio-pika's one-node connect step is replaced by one that knows which nodes are up."""

from __future__ import annotations

import os
from typing import Any

import aio_pika
import pytest
from aio_pika.robust_connection import RobustConnection
from yarl import URL

from saga_shared.config import Settings
from saga_shared.transport.bus import Bus
from saga_shared.transport.cluster_connection import (
    ClusterConnection,
    connect_cluster,
    in_turn,
    start_offset,
)

URL3 = "amqp://u:p@mq1:5672,mq2:5672,mq3:5672/vh"
NODES = ["amqp://u:p@mq1:5672/vh", "amqp://u:p@mq2:5672/vh", "amqp://u:p@mq3:5672/vh"]


def test_in_turn_starts_at_the_offset_and_goes_round() -> None:
    assert in_turn(NODES, 0) == NODES
    assert in_turn(NODES, 1) == [NODES[1], NODES[2], NODES[0]]
    assert in_turn(NODES, 2) == [NODES[2], NODES[0], NODES[1]]
    assert in_turn(NODES, 3) == NODES
    assert in_turn(NODES, 7000) == in_turn(NODES, 1)  # a pid, say


def test_the_start_follows_the_pid_and_each_connection_of_a_process_moves_one_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(os, "getpid", lambda: 4000)
    first, second, third = start_offset(), start_offset(), start_offset()
    assert first >= 4000
    assert (second, third) == (first + 1, first + 2)
    firsts = {in_turn(NODES, s)[0] for s in (first, second, third)}
    assert firsts == set(NODES)  # three connections of one process: one per node

    monkeypatch.setattr(os, "getpid", lambda: 4001)
    assert start_offset() == third + 2  # another process, further on from the same count


class Recorded:
    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.reconnect_callbacks: set[object] = set()  # Bus says when it is connected again

    async def __call__(self, url: str, **kwargs: Any) -> Any:
        self.calls.append((url, kwargs))
        return self

    async def channel(self, **_: Any) -> object:
        return object()


def order_of(kwargs: dict[str, Any]) -> list[str]:
    """The nodes a connection made with these arguments walks, in order."""
    return [str(url) for url in kwargs["connection_class"].NODES]


async def test_connect_cluster_dials_the_start_node_first_and_keeps_the_rest_in_turn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    recorded = Recorded()
    monkeypatch.setattr(aio_pika, "connect_robust", recorded)

    await connect_cluster(URL3, start=2, timeout=3)
    await connect_cluster(URL3, start=1)
    await connect_cluster("amqp://u:p@mq1:5672/vh", start=2)  # one node: nothing to choose

    (url, kwargs), (url_1, kwargs_1), (single, single_kwargs) = recorded.calls
    assert url == NODES[2]
    assert kwargs["timeout"] == 3
    assert order_of(kwargs) == in_turn(NODES, 2)
    assert url_1 == NODES[1]
    assert order_of(kwargs_1) == in_turn(NODES, 1)
    assert (single, single_kwargs) == ("amqp://u:p@mq1:5672/vh", {})


async def test_when_the_node_in_use_goes_away_the_next_one_is_tried_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    up = set(NODES)
    dialled: list[str] = []

    async def one_node(self: ClusterConnection) -> None:
        dialled.append(str(self.url))
        if str(self.url) not in up:
            raise ConnectionError(f"{self.url} is down")

    monkeypatch.setattr(RobustConnection, "_RobustConnection__connect_transport", one_node)
    nodes = tuple(URL(n) for n in in_turn(NODES, 1))
    cls = type("ClusterConnection", (ClusterConnection,), {"NODES": nodes})
    connection = cls(nodes[0])
    step = connection._RobustConnection__connect_transport

    await step()
    assert dialled == [NODES[1]]
    up.remove(NODES[1])
    await step()  # its node went away: the next one after it
    assert dialled == [NODES[1], NODES[2]]
    up.clear()
    up.add(NODES[1])
    await step()  # the one after it is down too: round past the list's end, to the first
    assert dialled[2:] == [NODES[0], NODES[1]]
    up.clear()
    with pytest.raises(ConnectionError):
        await step()  # every node tried once, from the one after, then the last refusal raised
    assert dialled[4:] == [NODES[2], NODES[0], NODES[1]]


async def test_every_node_is_dialled_with_a_heartbeat_of_half_the_lease_unless_the_url_names_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The broker drops a silent connection after two heartbeats: with half the lease, a frozen
    coordinator's queues pass when its locks do. What the URL says wins."""
    recorded = Recorded()
    monkeypatch.setattr(aio_pika, "connect_robust", recorded)
    lease = Settings(amqp_url=URL3, partition_lease_s=10.0)
    await Bus(lease).connect()
    await Bus(lease.with_(amqp_url=f"{URL3}?heartbeat=30")).connect()

    (_, kwargs), (_, kwargs_own) = recorded.calls
    assert all(URL(str(n)).query["heartbeat"] == "5" for n in kwargs["connection_class"].NODES)
    assert all(URL(str(n)).query["heartbeat"] == "30"
               for n in kwargs_own["connection_class"].NODES)  # fmt: skip
