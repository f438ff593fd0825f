"""Which partitions a coordinator owns: a Postgres session lock per partition.

AMQP never tells a consumer that it became a queue's single active one, nor a coordinator that a
queue on another node died. A session advisory lock per partition (the namespace and the
partition's number) decides instead, on a connection of the coordinator's own: it consumes
partition p while that session holds p's lock, and nobody else takes p meanwhile.

- A process that dies drops its connection, and with it its locks: another takes them at its
  next look (every ``SAGA_WATCHDOG_S``).
- A process that freezes stops looking; every look is a statement, and the server ends a session
  idle for ``SAGA_PARTITION_LEASE_S`` (``idle_session_timeout``), so its locks pass; the broker
  drops its silent connection about then (``Bus`` asks for a heartbeat of half the lease), so
  its queues' single active consumers pass to the process that took the locks. Woken, it
  finds its session gone, asks again for what it consumes, and stops consuming what another
  holds now. Until it has looked, it may still apply what it has in hand: every order's row lock
  and the guarded apply keep the register right with two appliers, and the partition queue's
  single active consumer keeps the other one standing by.
- Taking a partition (at the start too, and again after the session was lost) sends again the
  requests its running steps have out, uncounted (``QueueWatch.resume``): a request queue lost
  while nobody owned the partition, or while its owner was away, would otherwise wait for the
  deadlines.
- The database away: nothing changes (its messages wait either way); the consumers stay, so no
  delivery is handed back and counted for nothing.

The decision is ``change``, pure; ``Ownership.look`` does the one statement.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection
from dataclasses import dataclass

import asyncpg

from saga_coordinator.store import Q
from saga_shared.config import Settings

log = logging.getLogger(__name__)


def lock_session(settings: Settings, purpose: str) -> dict[str, str]:
    """Server settings of a connection whose session holds locks (the partitions', the
    relay's): the server ends it once idle for ``SAGA_PARTITION_LEASE_S``, at least three looks,
    so the locks of a frozen process pass and a live one's never do."""
    return {"idle_session_timeout": str(int(settings.lease_s * 1000)),
            "application_name": f"saga {purpose}"}  # fmt: skip


@dataclass(frozen=True)
class Change:
    """What a look changes: partitions to ``start`` and ``stop`` consuming, and those whose
    running requests are sent again (``resend``: every partition taken by this look)."""

    start: frozenset[int] = frozenset()
    stop: frozenset[int] = frozenset()
    resend: frozenset[int] = frozenset()


def change(consuming: Collection[int], asked: Collection[int], took: Collection[int]) -> Change:
    """``asked``: the locks the look asked for (what this process wants and its session does not
    hold: after a session was lost, what it consumes too); ``took``: those it got. A partition
    consumed, asked for again and not taken is another's now."""
    mine, took_ = set(consuming), set(took)
    return Change(
        start=frozenset(took_ - mine),
        stop=frozenset((mine & set(asked)) - took_),
        resend=frozenset(took_),
    )


class Ownership:
    """The lock session of one coordinator process. ``first``: the partitions it takes at once
    (its share); ``later``: those it takes only ``SAGA_STANDBY_AFTER_S`` into a session, so that
    after a start or a database restart every process takes its own share back first."""

    def __init__(self, settings: Settings, url: str) -> None:
        self.settings = settings
        self.url = url
        self.name = f"saga.partition:{settings.namespace}"
        self.held: set[int] = set()  # what the current session holds
        self._conn: asyncpg.Connection | None = None
        self._since = 0.0
        self._failing = False

    async def look(
        self, consuming: Collection[int], first: Collection[int], later: Collection[int]
    ) -> Change:
        """Ask for the wanted partitions this session does not hold; a statement either way (the
        session's beat). The database away: no change."""
        now = asyncio.get_running_loop().time()
        try:
            if self._conn is None or self._conn.is_closed():
                self.held = set()
                self._conn = await asyncpg.connect(
                    self.url, server_settings=lock_session(self.settings, "partitions")
                )
                self._since = now
            wanted = set(consuming) | set(first)
            if now - self._since >= self.settings.standby_after_s:
                wanted |= set(later)
            asked = sorted(wanted - self.held)
            rows = await self._conn.fetch(Q.partitions_take, self.name, asked)
        except Exception as exc:  # the database away, or the session ended (a freeze)
            await self.close()
            if not self._failing:
                log.warning("could not look at the partition locks (%r): looking again", exc)
            self._failing = True
            return Change()
        self._failing = False
        took = {int(r["p"]) for r in rows}
        self.held |= took
        decided = change(consuming, asked, took)
        if decided.stop:
            log.warning("partition(s) %s are another coordinator's now: not consumed here",
                        sorted(decided.stop))  # fmt: skip
        return decided

    async def close(self) -> None:
        """End the session: its locks pass at once."""
        conn, self._conn, self.held = self._conn, None, set()
        if conn is not None and not conn.is_closed():
            try:
                await asyncio.wait_for(conn.close(), timeout=2.0)
            except Exception:
                conn.terminate()
