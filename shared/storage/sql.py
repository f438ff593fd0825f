"""Named SQL queries read from ``.sql`` files: a block starts with ``-- name: query_name``."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg
from tenacity import AsyncRetrying, retry_if_exception, wait_exponential

from saga_shared.loop import stop_after_s

# Errors after which the same transaction may well succeed: the database is restarting, shutting
# down or unreachable, out of connections, or two transactions collided.
TRANSIENT_DB_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.exceptions.OperatorInterventionError,  # shutting down, starting up
    asyncpg.TooManyConnectionsError,
    asyncpg.SerializationError,
    asyncpg.DeadlockDetectedError,
    # A pooled connection the server dropped while it was idle can fail its next statement
    # with this instead of a connection error (seen when Postgres shuts down under load);
    # treated as anything else, the message was requeued without a block and one order's
    # commands ran out of publish order.
    asyncpg.exceptions._base.InternalClientError,
)

# A value the database (or asyncpg, before sending it) refuses: never transient, whatever its
# base class says (asyncpg's client-side DataError is an InterfaceError).
VALUE_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.exceptions.DataError,
    asyncpg.exceptions._base.DataError,
)


def is_transient(error: BaseException) -> bool:
    return isinstance(error, TRANSIENT_DB_ERRORS) and not isinstance(error, VALUE_ERRORS)


def holding(hold_s: float, *, before_sleep: Callable[[Any], Any] | None = None) -> AsyncRetrying:
    """The hold while the database is away: tried again with backoff, for ``hold_s`` on the
    loop's clock, the last error raised. Made where the holding starts."""
    return AsyncRetrying(
        retry=retry_if_exception(is_transient), wait=wait_exponential(multiplier=0.05, max=2.0),
        stop=stop_after_s(hold_s), before_sleep=before_sleep, reraise=True,
    )  # fmt: skip


_NAME = re.compile(r"^--\s*name:\s*([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)


class Queries:
    def __init__(self, path: Path) -> None:
        text = path.read_text(encoding="utf-8")
        parts = _NAME.split(text)
        self._queries: dict[str, str] = {}
        for name, body in zip(parts[1::2], parts[2::2], strict=True):
            if name in self._queries:
                raise ValueError(f"{path}: query {name!r} is defined twice")
            self._queries[name] = body.strip()
        self._path = path

    def __getattr__(self, name: str) -> str:
        try:
            return self._queries[name]
        except KeyError:
            raise AttributeError(f"{self._path.name} has no query named {name!r}") from None


async def _keep_session(conn: asyncpg.Connection) -> None:
    """asyncpg's default reset costs a round trip per transaction (``RESET ALL``, ``UNLISTEN
    *``...). Pool connections here never hold session state: locks are transaction-scoped and
    LISTEN has a connection of its own. asyncpg still rolls back an unfinished transaction."""


async def create_pool(
    url: str, *, min_size: int, max_size: int, plan_cache_mode: str | None = None,
    idle_in_transaction_s: float | None = None,
) -> asyncpg.Pool:  # fmt: skip
    """``plan_cache_mode``: Postgres's setting for the pool's sessions (None: the server's).
    ``idle_in_transaction_s``: the server ends a session that sat that long inside a transaction
    (its process frozen), so the row locks it held do not stop every other process."""
    server = {} if plan_cache_mode is None else {"plan_cache_mode": plan_cache_mode}
    if idle_in_transaction_s is not None:
        server["idle_in_transaction_session_timeout"] = str(int(idle_in_transaction_s * 1000))
    return await asyncpg.create_pool(
        url, min_size=min_size, max_size=max_size, reset=_keep_session, server_settings=server
    )
