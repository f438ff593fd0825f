"""Where one saga's time goes at concurrency 1: ``python -m benchmarks.timeline``.

The stack runs as in the benchmark (``benchmarks.harness``) and the agents' load sends refund
sagas one at a time while ``tcpdump`` records the loopback's packets to and from the broker and
the database. At concurrency 1 nothing overlaps, so each saga's latency is a chain of segments,
read off the packets' times:

- a broker hop: a publish (a packet of content to the broker) to the delivery it causes;
- a statement: a process's packet to the database to the database's reply;
- a process's turn: a delivery to its statement, and the statement's reply to its publish.

Needs ``tcpdump`` and the right to capture on the loopback (root, or ``CAP_NET_RAW``). Only
this stack should talk to the broker and the database meanwhile: any other client is counted
as the agents."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import statistics
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from benchmarks.harness import SETTLE_S, _fresh, _start_processes, _stop
from benchmarks.load import inject_faults, new_run_id, run_load
from saga_shared import loop
from saga_shared.addresses import one_per_host
from saga_shared.config import Settings
from saga_shared.errors import ConfigError

BROKER, DATABASE = "broker", "database"
CONTENT = 100  # bytes: a publish or a delivery carries a message; acks and confirms are ~21
_LINE = re.compile(r"(\d+)\.(\d{6}) IP [\d.]+\.(\d+) > [\d.]+\.(\d+): .*length (\d+)")


@dataclass(frozen=True)
class Packet:
    at: int  # microseconds (tcpdump's resolution; a float of epoch seconds would round it)
    source: str
    target: str
    size: int


def packets(
    lines: Iterable[str], owners: Mapping[int, str], ports: Mapping[int, str]
) -> list[Packet]:
    """``tcpdump -tt -n`` lines as packets between named parties: ``ports`` names the servers'
    ports, ``owners`` the clients' local ports; any other client is ``agent``."""

    def name(port: int) -> str:
        return ports.get(port) or owners.get(port, "agent")

    found = []
    for line in lines:
        m = _LINE.match(line)
        if m is None or int(m.group(5)) == 0:
            continue  # a bare ack of TCP's
        at = int(m.group(1)) * 1_000_000 + int(m.group(2))
        found.append(Packet(at, name(int(m.group(3))), name(int(m.group(4))), int(m.group(5))))
    return found


def segments(chain: Iterable[Packet]) -> dict[str, list[float]]:
    """Each segment's durations in ms, named as in the module's docstring."""
    found: dict[str, list[float]] = {}
    delivered: dict[str, int] = {}  # a process's last delivery, until its statement
    answered: dict[str, int] = {}  # its last reply from the database, until its publish
    asked: dict[str, int] = {}  # its statement in flight
    published: tuple[str, int] | None = None

    def add(name: str, since: int, now: int) -> None:
        found.setdefault(name, []).append((now - since) / 1000)

    for p in chain:
        if p.source == BROKER and p.size > CONTENT:
            if published is not None:
                add(f"broker: {published[0]} to {p.target}", published[1], p.at)
                published = None
            delivered[p.target] = p.at
        elif p.target == DATABASE:
            if p.source in delivered:
                add(f"{p.source}: delivery to statement", delivered.pop(p.source), p.at)
            asked[p.source] = p.at
        elif p.source == DATABASE and p.target in asked:
            add(f"database: {p.target} statement", asked.pop(p.target), p.at)
            answered[p.target] = p.at
        elif p.target == BROKER and p.size > CONTENT:
            if p.source in answered:
                add(f"{p.source}: reply to publish", answered.pop(p.source), p.at)
            published = (p.source, p.at)
    return found


def local_ports(pid: int) -> set[int]:
    """The local TCP ports of a process's sockets, from /proc."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # closed since the listing
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            fields = row.split()
            if fields[9] in inodes:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


async def capture(
    settings: Settings, sagas: int, tcpdump: str
) -> tuple[list[float], dict[int, str], list[str]]:
    """One c=1 refund load on a fresh stack: its latencies, the stack processes' local ports and
    the packets tcpdump recorded meanwhile (``tcpdump -tt -n`` lines)."""
    where = " or ".join(f"tcp port {port}" for port in server_ports(settings))
    async with _fresh(settings) as run_settings:
        run = new_run_id()
        await inject_faults(run_settings.database_url, run, sagas, "refund")
        procs = await _start_processes(run_settings, 1)
        try:
            await asyncio.sleep(SETTLE_S)
            await run_load(run_settings, f"w{run}", 20, 1, "refund")
            owners = {port: name for name, proc in procs for port in local_ports(proc.pid)}
            with tempfile.TemporaryDirectory() as scratch:
                pcap = Path(scratch) / "saga.pcap"
                dump = await asyncio.create_subprocess_exec(
                    tcpdump, "-i", "lo", "-n", "-w", str(pcap), where,
                    stderr=asyncio.subprocess.DEVNULL,
                )  # fmt: skip
                await asyncio.sleep(1.0)  # tcpdump is listening
                load = await run_load(run_settings, run, sagas, 1, "refund")
                await asyncio.sleep(0.3)
                dump.send_signal(signal.SIGINT)  # tcpdump writes out what it holds
                await dump.wait()
                if not pcap.exists():
                    raise SystemExit("tcpdump recorded nothing: may this user capture on lo?")
                read = await asyncio.create_subprocess_exec(
                    tcpdump, "-r", str(pcap), "-tt", "-n",
                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
                )  # fmt: skip
                text, _ = await read.communicate()
        finally:
            await _stop(procs)
    return load.latencies_ms, owners, text.decode().splitlines()


DEFAULT_PORTS = {"amqp": 5672, "amqps": 5671, "postgres": 5432, "postgresql": 5432}


def server_ports(settings: Settings) -> dict[int, str]:
    """Every port of the broker's nodes and the database's hosts (a URL may name several)."""
    ports = {}
    for url, name in ((settings.amqp_url, BROKER), (settings.database_url, DATABASE)):
        for one in one_per_host(url):
            parts = urlsplit(one)
            ports[parts.port or DEFAULT_PORTS.get(parts.scheme, 0)] = name
    return ports


def summary(found: Mapping[str, list[float]], latencies: list[float]) -> dict[str, object]:
    sagas = len(latencies)
    rows = {
        name: {"per_saga": len(values) / sagas, "median_ms": statistics.median(values),
               "ms_per_saga": sum(values) / sagas}
        for name, values in sorted(found.items())
    }  # fmt: skip
    return {"sagas": sagas, "p50_ms": statistics.median(latencies),
            "mean_ms": statistics.fmean(latencies), "segments": rows}  # fmt: skip


def _table(report: dict[str, object]) -> list[str]:
    rows = report["segments"]
    assert isinstance(rows, dict)
    lines = [f"{report['sagas']} refund sagas one at a time: p50 {report['p50_ms']:.2f} ms, "
             f"mean {report['mean_ms']:.2f} ms",
             f"{'segment':44} {'a saga':>6} {'median ms':>10} {'ms a saga':>10}"]  # fmt: skip
    for name, row in rows.items():
        lines.append(f"{name:44} {row['per_saga']:6.1f} {row['median_ms']:10.3f} "
                     f"{row['ms_per_saga']:10.2f}")  # fmt: skip
    total = sum(row["ms_per_saga"] for row in rows.values())
    return [*lines, f"{'sum of the segments':44} {'':6} {'':10} {total:10.2f}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sagas", type=int, default=300, help="refund sagas, one at a time")
    parser.add_argument("--json", action="store_true", help="the summary as one JSON object")
    args = parser.parse_args()
    if args.sagas < 1:
        raise SystemExit(f"--sagas must be 1 or more, not {args.sagas}")
    tcpdump = shutil.which("tcpdump")
    if tcpdump is None:
        raise SystemExit("benchmarks.timeline needs tcpdump (Debian: apt-get install tcpdump)")
    try:
        settings = Settings.from_env()
    except ConfigError as exc:  # one line naming the variable, not a traceback
        raise SystemExit(str(exc)) from None
    latencies, owners, lines = loop.run(capture(settings, args.sagas, tcpdump))
    ports = server_ports(settings)
    found = segments(packets(lines, owners, ports))
    if not found:  # e.g. the broker or the database reached over IPv6 or a Unix socket
        raise SystemExit(f"none of tcpdump's {len(lines)} lines was a packet over IPv4 "
                         f"to port {', '.join(map(str, ports))}")  # fmt: skip
    report = summary(found, latencies)
    print(json.dumps(report) if args.json else "\n".join(_table(report)))


if __name__ == "__main__":
    main()
