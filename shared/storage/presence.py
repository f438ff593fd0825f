"""Each running coordinator and adapter says it is alive: a row of ``processes`` it writes
every ``SAGA_HEARTBEAT_S``, with what its consumers received per queue (and a coordinator, the
partitions it holds the locks of). A process that stops says so; one that was killed, froze,
or lost the database stops writing, and readers (the console's Health page, the coordinator's
``saga_processes`` gauge) see it go silent: nobody has to guess whether it is still there."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import socket
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import asyncpg

from saga_shared.observability.flow import FLOW
from saga_shared.storage.sql import TRANSIENT_DB_ERRORS, Queries

log = logging.getLogger(__name__)
Q = Queries(Path(__file__).with_name("presence.sql"))
Kind = Literal["coordinator", "adapter"]
_UNWRITTEN: tuple[type[BaseException], ...] = (*TRANSIENT_DB_ERRORS, TimeoutError)


@dataclass
class Presence:
    pool: asyncpg.Pool
    namespace: str
    kind: Kind
    name: str
    queues: Sequence[str]
    version: str
    every_s: float = 5.0
    # A coordinator's: the partitions it holds the locks of now (None for an adapter).
    holding: Callable[[], Collection[int]] | None = None
    host: str = field(default_factory=lambda: socket.gethostname()[:64])
    pid: int = field(default_factory=os.getpid)
    id: str = ""
    _quiet: bool = field(default=False, repr=False)

    def __post_init__(self) -> None:
        # Host and pid for a person reading the list; the random part because a pid is reused
        # (a container restarted is pid 1 again) and must not revive its predecessor's row.
        self.id = self.id or f"{self.host}:{self.pid}:{self.name}:{secrets.token_hex(3)}"

    async def run(self) -> None:
        try:
            while True:
                await self.beat()
                await asyncio.sleep(self.every_s)
        finally:
            # Shielded and short: a stop should say so, but never wait on a database away.
            stopping = asyncio.ensure_future(self._say(Q.stopped, self.id))
            await asyncio.wait([stopping], timeout=2.0)

    async def beat(self) -> None:
        counts = json.dumps(FLOW.counts(self.queues))
        held = None if self.holding is None else sorted(self.holding())
        await self._say(Q.beat, self.id, self.namespace, self.kind, self.name, self.host,
                        self.pid, self.version, counts, held)  # fmt: skip

    async def _say(self, query: str, *args: object) -> None:
        try:
            await self.pool.execute(query, *args, timeout=self.every_s)
        except _UNWRITTEN as exc:
            # Not written is shown as silent, which is the truth an operator needs: a
            # component cut off from the database cannot do its work either.
            self._once(logging.WARNING, "heartbeat of %s not written: %r", exc)
        except asyncpg.PostgresError as exc:
            # A grant or a migration missing: the component still works, so it keeps
            # running, shown silent, and says once what to do.
            self._once(logging.ERROR, "heartbeat of %s refused (%r): run `saga setup` "
                       "again to migrate and grant", exc)  # fmt: skip
        else:
            self._quiet = False

    def _once(self, level: int, text: str, exc: BaseException) -> None:
        if not self._quiet:
            log.log(level, text, self.name, exc)
        self._quiet = True
