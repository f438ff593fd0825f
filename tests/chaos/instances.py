"""Disposable PostgreSQL and RabbitMQ servers, for tests that crash or restart them.

Each instance runs as its server's OS user, on free ports, in its own temporary directory, and is
removed on exit: by ``close()`` (``async with``), and by an ``atexit`` hook if the test process
dies before its ``finally`` blocks run. They never touch the machine's shared servers: every
command names the instance's own data directory (``pg_ctl -D``) or node (``rabbitmqctl -n``).

    async with DisposablePostgres() as pg, DisposableRabbit() as rabbit:
        url = pg.url("saga"); await pg.crash(); await pg.start()
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import os
import pwd
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from types import TracebackType
from typing import Self

import aio_pika
import asyncpg

from saga_coordinator.tls import TlsFiles

PG_BIN = Path("/usr/lib/postgresql/15/bin")
# The host part of the RabbitMQ node name; "localhost" resolves here and is what the shared node
# uses too (see /etc/rabbitmq/rabbitmq-env.conf).
RABBIT_HOST = "localhost"
# Ports are drawn from 10000 up, outside the kernel's ephemeral range: a server restarted on a
# port in that range can find it taken by any process's outgoing connection meanwhile (a client
# retrying the dead node even connects to itself when its source port is the one it dials), and
# the restart fails with eaddrinuse.
LOWEST_PORT = 10_000
# The machine's shared services: never handed out, whatever the bind test says.
RESERVED_PORTS = frozenset({4369, 5432, 5672, 15672, 25672})

_handed_out: set[int] = set()


class InstanceError(RuntimeError):
    """A disposable server did not start or stop as asked; the message carries its log tail."""


# --- ports and commands ------------------------------------------------------------------------


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


@functools.cache
def _ephemeral_ports() -> range:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return range(int(low), int(high) + 1)
    except (OSError, ValueError):
        return range(32_768, 61_000)  # Linux's default


@functools.cache
def _candidate_ports() -> tuple[int, ...]:
    ephemeral = _ephemeral_ports()
    return tuple(p for p in range(LOWEST_PORT, 65_536) if p not in ephemeral)


def free_port() -> int:
    """A port nobody listens on and no outgoing connection will be given."""
    rng = random.Random()  # not the test's seeded RNG: ports must differ between runs
    for _ in range(500):
        port = rng.choice(_candidate_ports())
        if port in RESERVED_PORTS or port in _handed_out:
            continue
        if _port_is_free(port):
            _handed_out.add(port)
            return port
    raise InstanceError(
        f"no free port from {LOWEST_PORT} outside the ephemeral range {_ephemeral_ports()}"
    )


def _as_user(user: str, argv: list[str], env: dict[str, str] | None = None) -> list[str]:
    """``argv`` run as ``user`` with exactly the given extra environment."""
    extra = [f"{k}={v}" for k, v in (env or {}).items()]
    command = ["env", *extra, *argv]
    if os.geteuid() == 0:
        return ["runuser", "-u", user, "--", *command]
    if pwd.getpwuid(os.geteuid()).pw_name != user:
        raise InstanceError(f"run as root or as {user!r} to manage a disposable server")
    return command


async def _run(argv: list[str], *, cwd: Path, limit_s: float = 120.0) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), limit_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise InstanceError(f"{' '.join(argv)}: no answer within {limit_s:g}s") from None
    return proc.returncode or 0, out.decode(errors="replace")


async def _run_checked(argv: list[str], *, cwd: Path, limit_s: float = 120.0) -> str:
    code, out = await _run(argv, cwd=cwd, limit_s=limit_s)
    if code != 0:
        raise InstanceError(f"{' '.join(argv)} exited {code}:\n{out[-3000:]}")
    return out


def _own_dir(prefix: str, user: str) -> Path:
    """A fresh temporary directory the server's OS user can read and write."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    entry = pwd.getpwnam(user)
    if os.geteuid() == 0:
        os.chown(path, entry.pw_uid, entry.pw_gid)
    path.chmod(0o700)
    return path


def _chown_tree(path: Path, user: str) -> None:
    if os.geteuid() != 0:
        return
    entry = pwd.getpwnam(user)
    for item in [path, *path.rglob("*")]:
        os.chown(item, entry.pw_uid, entry.pw_gid)


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie waiting to be reaped counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


async def _wait_gone(pid: int, limit_s: float) -> bool:
    deadline = time.monotonic() + limit_s
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


def _tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return f"({path} unreadable)"


# --- emergency cleanup ---------------------------------------------------------------------------

_live: dict[int, DisposablePostgres | DisposableRabbit] = {}


def _cleanup_at_exit() -> None:
    """Last resort when a test process ends without closing its instances (a timeout kill)."""
    for instance in list(_live.values()):
        with contextlib.suppress(Exception):
            instance.kill_now()


atexit.register(_cleanup_at_exit)


class _Instance:
    async def __aenter__(self) -> Self:
        try:
            await self.start()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def start(self) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError


# --- PostgreSQL ----------------------------------------------------------------------------------


class DisposablePostgres(_Instance):
    """A PostgreSQL 15 cluster of its own: trust auth, user ``postgres``, fsync on. With
    ``tls``, it refuses every connection over TCP that is not TLS (``hostnossl ... reject``)."""

    def __init__(
        self,
        *,
        max_connections: int = 300,
        tls: TlsFiles | None = None,
        conf: dict[str, str] | None = None,
    ) -> None:
        self.port = free_port()
        self.max_connections = max_connections
        self.tls = tls
        self.conf = conf or {}  # postgresql.conf lines, written after initdb
        self.dir: Path | None = None
        self.running = False
        self.starts = 0

    @property
    def data(self) -> Path:
        assert self.dir is not None, "not started"
        return self.dir / "data"

    @property
    def log_path(self) -> Path:
        assert self.dir is not None, "not started"
        return self.dir / "log"

    def url(self, dbname: str = "postgres") -> str:
        if self.tls is not None:  # the certificate names localhost: verify-full checks it
            return (f"postgresql://postgres@localhost:{self.port}/{dbname}"
                    f"?sslmode=verify-full&sslrootcert={self.tls.ca}")  # fmt: skip
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def _pg_ctl(self, *args: str) -> list[str]:
        return _as_user("postgres", [str(PG_BIN / "pg_ctl"), "-D", str(self.data), *args])

    async def start(self) -> None:
        if self.running:
            return
        if self.dir is None:
            self.dir = _own_dir("saga-chaos-pg-", "postgres")
            _live[id(self)] = self
            initdb = [str(PG_BIN / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres"]
            await self._make_data(initdb)
            if self.tls is not None:
                self._require_tls(self.tls)
        options = (
            f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=on"
            f" -c max_connections={self.max_connections}"
        )
        if self.tls is not None:
            options += " -c ssl=on -c ssl_cert_file=server.pem -c ssl_key_file=server.key"
        code, out = await _run(
            self._pg_ctl("-o", options, "-l", str(self.log_path), "-w", "-t", "120", "start"),
            cwd=self.dir,
        )
        if code != 0:
            raise InstanceError(f"postgres did not start ({code}): {out}\n{_tail(self.log_path)}")
        self.running = True
        self.starts += 1
        await self._wait_ready()

    async def _make_data(self, initdb: list[str]) -> None:
        """The data directory: ``initdb``, then ``conf``; a standby copies its primary's."""
        assert self.dir is not None
        await _run_checked(_as_user("postgres", initdb), cwd=self.dir)
        self.write_conf(self.conf)

    def write_conf(self, conf: dict[str, str]) -> None:
        if conf:
            with (self.data / "postgresql.conf").open("a", encoding="utf-8") as out:
                out.writelines(f"{name} = '{value}'\n" for name, value in conf.items())

    def _require_tls(self, tls: TlsFiles) -> None:
        shutil.copy(tls.cert, self.data / "server.pem")
        shutil.copy(tls.key, self.data / "server.key")
        (self.data / "server.key").chmod(0o600)
        (self.data / "pg_hba.conf").write_text(
            "local all all trust\n"
            "hostssl all all 127.0.0.1/32 trust\n"
            "hostnossl all all 0.0.0.0/0 reject\n"
        )
        _chown_tree(self.data, "postgres")

    async def _wait_ready(self, limit_s: float = 30.0) -> None:
        deadline = time.monotonic() + limit_s
        while True:
            try:
                conn = await asyncpg.connect(self.url(), timeout=2)
            except (OSError, asyncpg.PostgresError) as exc:
                if time.monotonic() > deadline:
                    raise InstanceError(f"postgres on {self.port} not ready: {exc!r}") from exc
                await asyncio.sleep(0.1)
            else:
                await conn.close()
                return

    async def _stop(self, mode: str) -> None:
        if not self.running:
            return
        assert self.dir is not None
        await _run_checked(self._pg_ctl("-m", mode, "-w", "-t", "60", "stop"), cwd=self.dir)
        self.running = False

    async def stop(self) -> None:
        """A clean shutdown (``-m fast``): sessions are ended, the data is checkpointed."""
        await self._stop("fast")

    async def crash(self) -> None:
        """``-m immediate``: every process quits at once; the next start runs crash recovery."""
        await self._stop("immediate")

    async def restart(self) -> None:
        await self.stop()
        await self.start()

    async def dump(self, dbname: str, dest: Path) -> None:
        """``pg_dump -Fc`` of one database, to look at a failed run afterwards
        (``pg_restore -d <db> <file>``)."""
        assert self.dir is not None
        argv = [str(PG_BIN / "pg_dump"), "-Fc", "-h", "127.0.0.1", "-p", str(self.port)]
        argv += ["-U", "postgres", "-f", str(dest), dbname]
        dest.parent.mkdir(parents=True, exist_ok=True)
        await _run_checked(argv, cwd=dest.parent, limit_s=300)

    async def restore(self, dump: Path, dbname: str) -> None:
        """A database of this cluster from a ``dump`` file."""
        conn = await asyncpg.connect(self.url())
        try:
            await conn.execute(f'CREATE DATABASE "{dbname}"')
        finally:
            await conn.close()
        argv = [str(PG_BIN / "pg_restore"), "-h", "127.0.0.1", "-p", str(self.port)]
        argv += ["-U", "postgres", "-d", dbname, str(dump)]
        await _run_checked(argv, cwd=dump.parent, limit_s=300)

    def archive_log(self, dest: Path) -> None:
        if self.dir is not None and self.log_path.exists():
            dest.mkdir(parents=True, exist_ok=True)
            shutil.copy(self.log_path, dest / "postgres.log")

    async def close(self) -> None:
        try:
            if self.running:
                await self.crash()  # disposable: no need to checkpoint what is deleted next
        finally:
            self.kill_now()

    def kill_now(self) -> None:
        """Synchronous and forceful: for ``close`` and the ``atexit`` hook."""
        if self.dir is None:
            return
        if self.running and self.data.exists():
            subprocess.run(
                self._pg_ctl("-m", "immediate", "stop"), capture_output=True, check=False
            )
            self.running = False
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir = None
        _live.pop(id(self), None)


# --- RabbitMQ ------------------------------------------------------------------------------------


class DisposableRabbit(_Instance):
    """A RabbitMQ node of its own (no plugins), guest/guest from localhost.

    The data directory survives ``stop``/``crash``/``start``, so quorum queues and the messages
    they hold survive a restart as they would in production."""

    def __init__(
        self,
        *,
        name: str | None = None,
        tls: TlsFiles | None = None,
        conf: dict[str, str] | None = None,
        erl_args: str = "",
    ) -> None:
        self.tls = tls
        self.conf = conf or {}  # rabbitmq.conf lines, after the listener's
        self.erl_args = erl_args  # the Erlang runtime's flags (RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS)
        self.port = free_port()
        self.dist_port = free_port()  # Erlang distribution, between the cluster's nodes
        self.name = name or f"chaos{uuid.uuid4().hex[:10]}@{RABBIT_HOST}"
        # The shared node is rabbit@localhost: refuse any name that could be it.
        if not self.name.startswith("chaos") or "@" not in self.name:
            raise InstanceError(f"node name {self.name!r}: must start with 'chaos' and name a host")
        self.dir: Path | None = None
        self.running = False
        self.starts = 0

    def url(self, vhost: str = "") -> str:
        if self.tls is not None:  # TLS only; the certificate names localhost
            return f"amqps://guest:guest@localhost:{self.port}/{vhost}?cafile={self.tls.ca}"
        return f"amqp://guest:guest@127.0.0.1:{self.port}/{vhost}"

    @property
    def log_dir(self) -> Path:
        assert self.dir is not None, "not started"
        return self.dir / "log"

    def _env(self) -> dict[str, str]:
        assert self.dir is not None
        return {
            # The rabbitmq user's home holds the Erlang cookie that rabbitmqctl must present.
            "HOME": pwd.getpwnam("rabbitmq").pw_dir,
            "RABBITMQ_NODENAME": self.name,
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": str(self.dir / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.log_dir),
            "RABBITMQ_PID_FILE": str(self.dir / "pid"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.dir / "enabled_plugins"),
            # The machine's rabbitmq.conf pins the AMQP listener to 5672, the shared broker's
            # port: this node reads its own file instead.
            "RABBITMQ_CONFIG_FILE": str(self.dir / "rabbitmq.conf"),
            **({"RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": self.erl_args} if self.erl_args else {}),
        }

    def _prepare_dir(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="saga-chaos-rabbit-"))
        self.dir.chmod(0o755)
        (self.dir / "enabled_plugins").write_text("[].\n")
        conf = f"listeners.tcp.local = 127.0.0.1:{self.port}\n"
        if self.tls is not None:
            for name, source in (("ca.pem", self.tls.ca), ("server.pem", self.tls.cert),
                                 ("server.key", self.tls.key)):  # fmt: skip
                shutil.copy(source, self.dir / name)
            conf = "\n".join([
                "listeners.tcp = none",
                f"listeners.ssl.default = 127.0.0.1:{self.port}",
                f"ssl_options.cacertfile = {self.dir / 'ca.pem'}",
                f"ssl_options.certfile = {self.dir / 'server.pem'}",
                f"ssl_options.keyfile = {self.dir / 'server.key'}",
                "ssl_options.verify = verify_none",
                "ssl_options.fail_if_no_peer_cert = false",
                "",
            ])  # fmt: skip
        conf += "".join(f"{name} = {value}\n" for name, value in self.conf.items())
        (self.dir / "rabbitmq.conf").write_text(conf)
        _chown_tree(self.dir, "rabbitmq")
        _live[id(self)] = self

    async def start(self) -> None:
        if self.running:
            return
        if self.dir is None:
            self._prepare_dir()
        assert self.dir is not None
        await _run_checked(
            _as_user("rabbitmq", ["rabbitmq-server", "-detached"], self._env()), cwd=self.dir
        )
        self.running = True
        self.starts += 1
        await self._wait_amqp(limit_s=90.0)

    async def _wait_amqp(self, limit_s: float) -> None:
        """The node answers ``ping`` before its AMQP listener is up: wait for a real connection."""
        deadline = time.monotonic() + limit_s
        while True:
            try:
                # A plain TCP probe first: aiormq logs every refused AMQP attempt as an error.
                _, writer = await asyncio.open_connection("127.0.0.1", self.port)
                writer.close()
                connection = await aio_pika.connect(self.url(), timeout=3)
            except Exception as exc:
                if time.monotonic() > deadline:
                    log = _tail(self.log_dir / f"{self.name}.log")
                    self.archive_log(Path(tempfile.gettempdir()) / "saga-failed-rabbit" / self.name)
                    raise InstanceError(f"rabbitmq {self.name} not up: {exc!r}\n{log}") from exc
                await asyncio.sleep(0.2)
            else:
                await connection.close()
                return

    async def ctl(self, *args: str, tool: str = "rabbitmqctl") -> str:
        """``rabbitmqctl -n <this node> ...`` (or another of the CLI tools, such as
        ``rabbitmq-queues``), as the broker's user (it holds the cookie)."""
        assert self.dir is not None
        argv = [tool, "-n", self.name, *args]
        return await _run_checked(_as_user("rabbitmq", argv, self._env()), cwd=self.dir)

    def pid(self) -> int | None:
        if self.dir is None:
            return None
        try:
            return int((self.dir / "pid").read_text().strip())
        except (OSError, ValueError):
            return None

    async def stop(self) -> None:
        """A clean stop: ``rabbitmqctl -n <this node> stop``, then wait for the process to go."""
        if not self.running:
            return
        assert self.dir is not None
        pid = self.pid()
        ctl = ["rabbitmqctl", "-n", self.name, "stop"]
        await _run_checked(_as_user("rabbitmq", ctl, self._env()), cwd=self.dir)
        if pid is not None and not await _wait_gone(pid, 30):
            raise InstanceError(f"rabbitmq {self.name} (pid {pid}) still running after stop")
        self.running = False

    async def crash(self) -> None:
        """SIGKILL the node's beam process: no goodbye to clients, no flush."""
        if not self.running:
            return
        pid = self.pid()
        if pid is None:
            raise InstanceError(f"rabbitmq {self.name}: no pid file to crash")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        if not await _wait_gone(pid, 30):
            raise InstanceError(f"rabbitmq {self.name} (pid {pid}) survived SIGKILL")
        self.running = False

    async def restart(self) -> None:
        await self.stop()
        await self.start()

    def archive_log(self, dest: Path) -> None:
        if self.dir is None or not self.log_dir.exists():
            return
        dest.mkdir(parents=True, exist_ok=True)
        for path in self.log_dir.glob("*.log"):
            shutil.copy(path, dest / f"rabbitmq-{path.name}")

    async def close(self) -> None:
        try:
            if self.running:
                await self.crash()  # disposable: nothing to keep
        finally:
            self.kill_now()

    def kill_now(self) -> None:
        if self.dir is None:
            return
        pid = self.pid()
        if pid is not None and _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
        self.running = False
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir = None
        _live.pop(id(self), None)
