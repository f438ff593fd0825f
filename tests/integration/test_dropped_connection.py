"""A connection the broker drops, as an operator sees it: `saga run all` says so in one warning,
not in an error per channel, says when it is connected again, and runs the next saga; the
connection carries its process's name to whichever node it reaches again."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from saga_shared.addresses import hosts_of
from saga_shared.client import SagaClient
from saga_shared.config import Settings
from saga_shared.transport.bus import Bus
from saga_shared.transport.cluster_connection import connect_cluster
from saga_shared.transport.topology import Topology
from tests.integration.helpers import REFUND, Processes, remove_namespace


def connections_named(part: str) -> list[tuple[str, str]]:
    """The broker's connections whose client-given name holds ``part``: (pid, name)."""
    out = subprocess.run(
        ["rabbitmqctl", "list_connections", "pid", "client_properties", "-q"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    found = []
    for line in out.splitlines():
        pid, _, properties = line.partition("\t")
        if part in properties:
            name = properties.split('{"connection_name","', 1)[1].split('"', 1)[0]
            found.append((pid, name))
    return found


def drop(pid: str) -> None:
    subprocess.run(
        ["rabbitmqctl", "close_connection", pid, "dropped by a test"],
        capture_output=True, check=True, timeout=60,
    )  # fmt: skip


async def until(probe: Callable[[], bool], seconds: float = 30) -> None:
    """Wait for ``probe()`` to hold (it runs in a thread: it may call rabbitmqctl)."""
    for _ in range(int(seconds * 10)):
        if await asyncio.to_thread(probe):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{probe} did not hold within {seconds} s")


async def test_a_dropped_connection_is_one_warning_and_the_next_saga_runs(
    settings: Settings, tmp_path: Path, order_id: str
) -> None:
    procs = Processes(settings, tmp_path)
    try:
        proc = await procs.start("all", SAGA_LOG_LEVEL="INFO")  # "connected again" is INFO
        mine = f"{socket.gethostname()}:{proc.pid}"
        log = tmp_path / "all-0.log"
        await until(lambda: "Ctrl-C to stop" in log.read_text())  # its queues are declared
        async with Bus(settings) as bus, SagaClient(bus) as client:
            first = await client.start("refund", order_id=f"{order_id}-1", params=REFUND)
            assert (await client.wait(first, seconds=60)).status == "completed"
            held = connections_named(mine)
            assert held, "the process's connection names its host and pid"
            for pid, _ in held:
                drop(pid)
            await until(lambda: "connected to the broker again" in log.read_text())
            second = await client.start("refund", order_id=f"{order_id}-2", params=REFUND)
            assert (await client.wait(second, seconds=60)).status == "completed"
            assert connections_named(mine), "the connection made again has its name too"
    finally:
        await procs.stop_all()
        await remove_namespace(settings)

    lines = log.read_text().splitlines()
    libraries = [line for line in lines if " aiormq." in line or " aio_pika." in line]
    assert [line for line in libraries if "Unexpected connection close" in line and
            " WARNING " in line], lines  # fmt: skip
    assert not [line for line in lines if " ERROR " in line], lines
    assert not [line for line in libraries if "RobustChannel._on_close" in line], lines
    assert proc.returncode == 0


async def test_a_coordinator_connected_again_looks_for_lost_queues_at_once(
    settings: Settings, tmp_path: Path
) -> None:
    """A broker restart deletes the request queues, and with them what they held: so a
    coordinator whose connection is made again looks for them at once, without waiting for its
    watch's next look (an hour here)."""
    procs = Processes(settings, tmp_path)
    gone = Topology.from_settings(settings).request_queue("inventory")
    try:
        proc = await procs.start("coordinator", SAGA_LOG_LEVEL="INFO", SAGA_WATCHDOG_S="3600")
        log = tmp_path / "coordinator-0.log"
        await until(lambda: "Ctrl-C to stop" in log.read_text())
        async with Bus(settings) as bus:
            assert not await bus.missing([gone])
            channel = await bus.connection.channel()
            await channel.queue_delete(gone)  # as a restart would
            await channel.close()
            assert await bus.missing([gone]) == [gone]
            for pid, _ in connections_named(f"{socket.gethostname()}:{proc.pid}"):
                drop(pid)
            await until(lambda: "request queue(s) of inventory were gone" in log.read_text())
            assert not await bus.missing([gone])
    finally:
        await procs.stop_all()
        await remove_namespace(settings)


async def test_a_connection_made_again_on_another_node_keeps_its_name(settings: Settings) -> None:
    # Two names of this one broker stand for two nodes: the walk goes on to the second.
    [host] = hosts_of(settings.amqp_url)
    assert host.startswith("127.0.0.1"), "the test broker is this machine's"
    url = with_hosts(settings.amqp_url, [host, host.replace("127.0.0.1", "localhost", 1)])
    name = f"probe {os.getpid()} {os.urandom(4).hex()}"
    connection = await connect_cluster(url, start=0, client_properties={"connection_name": name})
    try:
        [(pid, _)] = connections_named(name)
        drop(pid)
        await until(lambda: any(p != pid for p, _ in connections_named(name)))
        assert "localhost" in str(connection.url)  # type: ignore[attr-defined]
        assert [n for _, n in connections_named(name)] == [name]
    finally:
        await connection.close()


def with_hosts(url: str, hosts: list[str]) -> str:
    parts = urlsplit(url)
    credentials, _, _ = parts.netloc.rpartition("@")
    return urlunsplit(parts._replace(netloc=f"{credentials}@{','.join(hosts)}"))
