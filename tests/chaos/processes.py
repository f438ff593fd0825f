"""The system under test as real OS processes (``saga run <component>``), killed at will.

The supervisor plays the part of a process manager (systemd, Docker's restart policy): a process
that exits without being asked to is recorded (with its log tail, for the report) and started
again after a short backoff. A process the chaos monkey SIGKILLs is restarted by the monkey.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

# One process per adapter and two coordinators, each owning half the partitions and taking over
# the other's when it dies or freezes.
COMPONENTS: dict[str, str] = {
    "coordinator-1": "coordinator",
    "coordinator-2": "coordinator",
    "inventory": "inventory",
    "erp": "erp",
    "payments": "payments",
    "email": "email",
}
# Or two processes that run everything, each with half the partitions (``--embedded``).
EMBEDDED: dict[str, str] = {"coordinator-1": "all", "coordinator-2": "all"}
SHARES: dict[str, str] = {"coordinator-1": "0/2", "coordinator-2": "1/2"}
MAIN_PACKAGE_DIR = Path(__file__).resolve().parents[2]

_children: set[int] = set()


def _kill_children_at_exit() -> None:
    """Never leave a `saga run` process behind, whatever ends the test process."""
    for pid in list(_children):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


atexit.register(_kill_children_at_exit)


def _share_of(name: str) -> dict[str, str]:
    return {"SAGA_COORDINATOR_SHARE": SHARES[name]} if name in SHARES else {}


@dataclass(frozen=True)
class ProcessExit:
    """A process that stopped on its own (no SIGKILL from us)."""

    name: str
    returncode: int
    at: float  # seconds since the supervisor started
    uptime_s: float
    log_tail: str


@dataclass
class _Running:
    proc: asyncio.subprocess.Process
    started: float
    killed: bool = False  # set before we signal it, so its watcher knows the exit was ours


@dataclass
class Supervisor:
    env: Mapping[str, str]
    log_dir: Path
    say: Callable[[str], None] = print
    components: Mapping[str, str] = field(default_factory=lambda: dict(COMPONENTS))

    def __post_init__(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.t0 = time.monotonic()
        self.kills: Counter[str] = Counter()
        self.freezes: Counter[str] = Counter()
        self.starts: Counter[str] = Counter()
        self.exits: list[ProcessExit] = []
        self._running: dict[str, _Running] = {}
        self._watchers: set[asyncio.Task[None]] = set()
        self._stopping = False

    def log_path(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    def is_running(self, name: str) -> bool:
        """Up and not being killed: a process sent SIGKILL stays listed until it is reaped,
        and a freeze drawn in that moment (CI's seed 3403412754) froze the dying process while
        its replacement answered, so no deadline fired."""
        running = self._running.get(name)
        return running is not None and not running.killed

    def pid(self, name: str) -> int | None:
        running = self._running.get(name)
        return None if running is None else running.proc.pid

    async def start_all(self) -> None:
        await asyncio.gather(*(self.start(name) for name in self.components))

    async def start(self, name: str) -> None:
        if name in self._running or self._stopping:
            return
        self.starts[name] += 1
        path = self.log_path(name)
        with path.open("ab") as log:
            stamp = datetime.now(UTC).isoformat()
            log.write(f"\n=== chaos harness: start #{self.starts[name]} at {stamp}\n".encode())
            log.flush()
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "saga_app.cli",
                "run",
                self.components[name],
                env=dict(self.env) | _share_of(name),
                cwd=MAIN_PACKAGE_DIR,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                # Its own session: a Ctrl-C meant for the harness does not reach it.
                start_new_session=True,
            )
        _children.add(proc.pid)
        running = _Running(proc, time.monotonic())
        self._running[name] = running
        watcher = asyncio.create_task(self._watch(name, running), name=f"watch-{name}")
        self._watchers.add(watcher)
        watcher.add_done_callback(self._watchers.discard)

    async def _watch(self, name: str, running: _Running) -> None:
        code = await running.proc.wait()
        _children.discard(running.proc.pid)
        if self._running.get(name) is running:
            del self._running[name]
        if running.killed or self._stopping:
            return
        now = time.monotonic()
        record = ProcessExit(
            name, code, now - self.t0, now - running.started, _tail(self.log_path(name))
        )
        self.exits.append(record)
        self.say(
            f"[{record.at:7.1f}s] {name} exited on its own (code {code}) after "
            f"{record.uptime_s:.1f}s; restarting it"
        )
        # A process manager's backoff: a process that cannot start (its database is down)
        # is not restarted in a tight loop.
        recent = sum(1 for e in self.exits if e.name == name and now - self.t0 - e.at < 30)
        await asyncio.sleep(min(0.5 * 2**recent, 8.0))
        await self.start(name)

    async def kill(self, name: str) -> bool:
        """SIGKILL ``name`` and wait for it to be gone; False if it was not running."""
        running = self._running.get(name)
        if running is None:
            return False
        running.killed = True
        with contextlib.suppress(ProcessLookupError):
            running.proc.send_signal(signal.SIGKILL)
        await running.proc.wait()
        self.kills[name] += 1
        return True

    async def freeze(self, name: str, seconds: float) -> bool:
        """SIGSTOP ``name`` for ``seconds``, then SIGCONT: a process that hangs, holding its
        deliveries and answering nothing. False if it was not running."""
        running = self._running.get(name)
        if running is None or running.killed:
            return False
        with contextlib.suppress(ProcessLookupError):
            running.proc.send_signal(signal.SIGSTOP)
        try:
            await asyncio.sleep(seconds)
        finally:
            with contextlib.suppress(ProcessLookupError):
                running.proc.send_signal(signal.SIGCONT)
        self.freezes[name] += 1
        return True

    async def stop_all(self, grace_s: float = 15.0) -> dict[str, bool]:
        """SIGTERM everything and wait ``grace_s``; SIGKILL the rest. Returns, per process,
        whether it stopped by itself after SIGTERM (graceful stop, issue 4 item 5)."""
        self._stopping = True
        running = dict(self._running)
        for r in running.values():
            r.killed = True
            with contextlib.suppress(ProcessLookupError):
                r.proc.send_signal(signal.SIGTERM)
        graceful: dict[str, bool] = {}
        for name, r in running.items():
            try:
                await asyncio.wait_for(r.proc.wait(), grace_s)
                graceful[name] = True
            except TimeoutError:
                graceful[name] = False
                with contextlib.suppress(ProcessLookupError):
                    r.proc.send_signal(signal.SIGKILL)
                await r.proc.wait()
        for watcher in list(self._watchers):
            watcher.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)
        return graceful


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
