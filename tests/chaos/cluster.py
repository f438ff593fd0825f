"""Disposable clusters on one machine: three RabbitMQ nodes joined into one cluster, and a
PostgreSQL primary with a synchronous streaming standby. Built from ``instances``' single
servers (own ports, node names and directories; removed on exit).

    async with RabbitCluster() as rabbit, ReplicatedPostgres() as pg:
        Settings(amqp_url=rabbit.url(), database_url=pg.url("saga"), quorum_size=3)
        await rabbit.nodes[0].crash(); await pg.fail_over()
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path

import asyncpg

from tests.chaos.instances import (
    PG_BIN,
    DisposablePostgres,
    DisposableRabbit,
    InstanceError,
    _as_user,
    _Instance,
    _run_checked,
)

# As in deploy/compose/rabbitmq-cluster.conf: each quorum queue led, when it is declared, by
# the node leading fewest. The default (client-local) puts every leader on the node of the
# connection that declares it, which was the first node of the URL for all of them.
CLUSTER_CONF = {"queue_leader_locator": "balanced"}


class RabbitCluster(_Instance):
    def __init__(self, size: int = 3, erl_args: str = "") -> None:
        self.nodes = [DisposableRabbit(conf=CLUSTER_CONF, erl_args=erl_args) for _ in range(size)]

    def url(self, vhost: str = "") -> str:
        """Every node, as ``saga_shared.addresses`` reads it."""
        hosts = ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)
        return f"amqp://guest:guest@{hosts}/{vhost}"

    async def _form(self) -> None:
        await asyncio.gather(*(n.start() for n in self.nodes))
        first = self.nodes[0]
        for node in self.nodes[1:]:
            await node.ctl("stop_app")
            await node.ctl("join_cluster", first.name)
            await node.ctl("start_app")
            await node._wait_amqp(limit_s=90.0)
        running = await self.running_nodes()
        if len(running) != len(self.nodes):
            raise InstanceError(f"cluster formed with {running}, not all {len(self.nodes)}")

    async def running_nodes(self, via: DisposableRabbit | None = None) -> list[str]:
        node = via or next(n for n in self.nodes if n.running)
        status = json.loads(await node.ctl("cluster_status", "--formatter", "json"))
        return sorted(status["running_nodes"])

    async def leaders(self, vhost: str = "/") -> dict[str, str]:
        """Each quorum queue of ``vhost`` and the node that leads it."""
        node = next(n for n in self.nodes if n.running)
        out = await node.ctl("list_queues", "-p", vhost, "name", "leader", "--formatter", "json")
        return {q["name"]: q["leader"] for q in json.loads(out) if q.get("leader")}

    async def busiest_leader(self, prefix: str, vhost: str = "/") -> DisposableRabbit:
        """The node leading most queues whose name starts with ``prefix``."""
        led = Counter(n for q, n in (await self.leaders(vhost)).items() if q.startswith(prefix))
        name = led.most_common(1)[0][0]
        return next(n for n in self.nodes if n.name == name)

    async def leaders_per_node(self, prefix: str, vhost: str = "/") -> dict[str, int]:
        """How many queues whose name starts with ``prefix`` each node leads, in the nodes'
        order; a node leading none is there with 0."""
        led = Counter(n for q, n in (await self.leaders(vhost)).items() if q.startswith(prefix))
        return {node.name: led[node.name] for node in self.nodes}

    async def rebalance(self) -> str:
        """``rabbitmq-queues rebalance quorum``, what docs/how-to/cluster.md has an operator run
        once a node is back: RabbitMQ 3.10 leaves each leader where it moved."""
        node = next(n for n in self.nodes if n.running)
        return await node.ctl("rebalance", "quorum", tool="rabbitmq-queues")

    # --- what the chaos harness asks of a broker (``DisposableRabbit``'s interface) ----------
    namespace = "chaos"  # whose partition queues' leaders are the victims

    @property
    def name(self) -> str:
        return ", ".join(n.name for n in self.nodes)

    @property
    def port(self) -> str:
        return ",".join(str(n.port) for n in self.nodes)

    @property
    def starts(self) -> int:
        """1 + the node restarts, as a single node counts its own."""
        return 1 + sum(n.starts - 1 for n in self.nodes)

    async def _victim(self) -> DisposableRabbit:
        try:
            return await self.busiest_leader(f"{self.namespace}.partition.")
        except (InstanceError, IndexError, ValueError):
            return next(n for n in self.nodes if n.running)

    async def crash(self) -> None:
        """SIGKILL the node leading most partition queues."""
        await (await self._victim()).crash()

    async def stop(self) -> None:
        await (await self._victim()).stop()

    async def start(self) -> None:
        if all(n.dir is None for n in self.nodes):
            await self._form()
            return
        for node in self.nodes:  # the nodes that are down rejoin on their own
            await node.start()

    def archive_log(self, dest: Path) -> None:
        for node in self.nodes:
            node.archive_log(dest / node.name.split("@")[0])

    async def close(self) -> None:
        for node in self.nodes:
            await node.close()


class _Standby(DisposablePostgres):
    """A streaming standby of ``primary``: its data is a base backup, not an initdb."""

    def __init__(self, primary: DisposablePostgres) -> None:
        # After a promotion it runs alone: it must not wait for a standby of its own.
        super().__init__(max_connections=primary.max_connections,
                         conf={"synchronous_standby_names": ""})  # fmt: skip
        self.primary = primary

    async def _make_data(self, initdb: list[str]) -> None:
        assert self.dir is not None
        backup = [str(PG_BIN / "pg_basebackup"), "-D", str(self.data), "-h", "127.0.0.1",
                  "-p", str(self.primary.port), "-U", "postgres", "-X", "stream", "-R"]  # fmt: skip
        await _run_checked(_as_user("postgres", backup), cwd=self.dir)
        self.write_conf(self.conf)

    async def promote(self) -> None:
        assert self.dir is not None
        await _run_checked(self._pg_ctl("-w", "-t", "60", "promote"), cwd=self.dir)


class ReplicatedPostgres(_Instance):
    """A primary that commits only once its standby has the WAL (synchronous replication),
    and that standby, streaming."""

    def __init__(self) -> None:
        self.primary = DisposablePostgres(conf={"synchronous_standby_names": "*"})
        self.standby = _Standby(self.primary)
        self.failed_over = False
        self.promote_s: float | None = None

    def url(self, dbname: str = "postgres") -> str:
        """Both servers, the writable one chosen by asyncpg."""
        hosts = f"127.0.0.1:{self.primary.port},127.0.0.1:{self.standby.port}"
        return f"postgresql://postgres@{hosts}/{dbname}?target_session_attrs=read-write"

    async def start(self) -> None:
        """Both at first; after a fail-over, the promoted standby (the old primary stays down:
        re-attaching it as a standby is an operator's job, or a fail-over manager's)."""
        if self.failed_over:
            await self.standby.start()
            return
        await self.primary.start()
        await self.standby.start()
        await self.wait_synchronous()

    async def wait_synchronous(self, limit_s: float = 30.0) -> None:
        conn = await asyncpg.connect(self.primary.url())
        try:
            async with asyncio.timeout(limit_s):
                query = "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'"
                while True:
                    if await conn.fetchval(query) >= 1:
                        return
                    await asyncio.sleep(0.1)
        finally:
            await conn.close()

    async def fail_over(self) -> float:
        """SIGKILL-like loss of the primary (``-m immediate``), then the standby promoted; the
        seconds the promotion took."""
        await self.primary.crash()
        started = asyncio.get_running_loop().time()
        await self.standby.promote()
        self.failed_over = True
        self.promote_s = asyncio.get_running_loop().time() - started
        return self.promote_s

    # --- what the chaos harness asks of a database (``DisposablePostgres``'s interface) -----
    @property
    def port(self) -> str:
        return f"{self.primary.port},{self.standby.port}"

    @property
    def starts(self) -> int:
        return self.primary.starts + self.standby.starts - 1

    async def crash(self) -> None:
        """The first time, a fail-over; then the promoted standby crashes like any server."""
        if not self.failed_over:
            await self.fail_over()
        else:
            await self.standby.crash()

    async def stop(self) -> None:
        await (self.standby.stop() if self.failed_over else self.primary.stop())

    async def dump(self, dbname: str, dest: Path) -> None:
        await (self.standby if self.failed_over else self.primary).dump(dbname, dest)

    def archive_log(self, dest: Path) -> None:
        self.primary.archive_log(dest / "primary")
        self.standby.archive_log(dest / "standby")

    async def close(self) -> None:
        await self.standby.close()
        await self.primary.close()
