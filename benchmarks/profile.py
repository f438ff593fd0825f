"""Where the processes spend their time under load: py-spy (from the ``bench`` extra) samples
the coordinator and the adapters during the busiest run; the report shows the functions that
cost most, by their own time and with what they call."""

from __future__ import annotations

import asyncio
import shutil
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

OUR_CODE = ("saga_coordinator/", "shared/", "services/")
ENTRY = ("/cli.py", "/cli_support.py")  # the process's entry: under everything, says nothing
# The metrics server's thread waiting for a scrape: py-spy samples it in its poll, as if busy.
IDLE = "serve_forever"


@dataclass(frozen=True)
class Profile:
    process: str
    samples: int
    own: list[tuple[str, float]]  # function, share of samples spent in it
    ours: list[tuple[str, float]]  # our functions, share of samples under them


def py_spy() -> str | None:
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else shutil.which("py-spy")


async def record(pids: dict[str, int], seconds: float, out_dir: Path) -> list[Profile]:
    """Sample every process at once for ``seconds``; nothing when py-spy is missing."""
    spy = py_spy()
    if spy is None:
        return []
    paths = {name: out_dir / f"profile-{name}.txt" for name in pids}
    runs = []
    for name, pid in pids.items():
        argv = ["record", "-p", str(pid), "-d", str(int(seconds)), "-r", "200", "-f", "raw",
                "-o", str(paths[name])]  # fmt: skip
        runs.append(
            await asyncio.create_subprocess_exec(
                spy, *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
            )
        )
    for run in runs:
        await run.wait()
    return [summarize(name, path) for name, path in paths.items() if path.exists()]


def _label(frame: str) -> str:
    # "function (path/to/file.py:123)" -> "function (file.py)"
    name, _, where = frame.partition(" (")
    return f"{name} ({where.rsplit('/', 1)[-1].split(':')[0]})" if where else name


def summarize(process: str, path: Path, top: int = 12) -> Profile:
    own: Counter[str] = Counter()
    ours: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit() or IDLE in stack:
            continue
        n = int(count)
        total += n
        frames = stack.split(";")
        own[_label(frames[-1])] += n
        mine = {_label(f) for f in frames if any(p in f for p in OUR_CODE)
                and not any(e in f for e in ENTRY)}  # fmt: skip
        for label in mine:
            ours[label] += n
    share = 1 / max(total, 1)
    return Profile(
        process, total,
        [(f, n * share) for f, n in own.most_common(top)],
        [(f, n * share) for f, n in ours.most_common(top)],
    )  # fmt: skip


def markdown(profiles: list[Profile]) -> list[str]:
    lines: list[str] = []
    for p in profiles:
        lines += [
            f"### {p.process} ({p.samples} samples)", "",
            "| own time | function | | with callees | our function |", "|---|---|---|---|---|",
        ]  # fmt: skip
        for (f1, s1), (f2, s2) in zip(p.own, p.ours, strict=False):
            lines.append(f"| {s1:.1%} | `{f1}` | | {s2:.1%} | `{f2}` |")
        lines.append("")
    return lines
