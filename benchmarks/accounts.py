"""A benchmark run in ``roles`` identity, the production mode: every process on its own broker
user and Postgres role, made by ``saga setup``'s own code in a vhost and database of the run's,
and removed with them afterwards (``python -m benchmarks --identity roles``). The agent's rate
limit is raised out of the load's way (``SAGA_AGENT_RATE``): a deployment sets it to what its
agents send."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from saga_coordinator.access import grants
from saga_coordinator.provision import (
    Report,
    database_passwords,
    db_roles,
    declare_topology,
    setup_broker,
    setup_database,
)
from saga_shared.config import Settings
from saga_shared.security.identity import db_role
from saga_shared.storage.migrations import drop_database

AGENT_RATE = 100_000  # commands a second: more than any load here sends


@contextlib.asynccontextmanager
async def roles_run(shared: Settings) -> AsyncIterator[Settings]:
    """``shared`` (a run's namespace and database, as ``settings_for_run`` makes them) with
    every role on its own account. The database URL stays the administrator's: the harness
    reads Postgres's statistics and plants faults through it; each process connects as its
    own role (``database_url_for``)."""
    secrets = Path(tempfile.mkdtemp(prefix="saga-bench-secrets-"))
    vhost = shared.namespace
    prefix = f"{shared.namespace}-"
    parts = urlsplit(shared.amqp_url)
    settings = shared.with_(
        amqp_url=urlunsplit(parts._replace(path=f"/{vhost}")), identity="roles",
        user_prefix=prefix, agents=f"{prefix}agent", secrets_dir=str(secrets),
        agent_rate=AGENT_RATE, agent_burst=AGENT_RATE,
    )  # fmt: skip
    try:
        report = Report()
        await asyncio.to_thread(setup_broker, settings, "rabbitmqctl", report)
        await declare_topology(settings)
        await setup_database(settings, shared.database_url, database_passwords(settings), report)
        yield settings
    finally:
        await drop_database(shared.database_url)
        await _remove_roles(settings)
        await asyncio.to_thread(_rabbitmqctl, "delete_vhost", vhost)
        for user in [g.user for g in grants(settings)]:
            await asyncio.to_thread(_rabbitmqctl, "delete_user", user)
        shutil.rmtree(secrets, ignore_errors=True)


async def _remove_roles(settings: Settings) -> None:
    admin = urlunsplit(urlsplit(settings.database_url)._replace(path="/postgres"))
    conn = await asyncpg.connect(admin)
    try:
        for role in (db_role(settings, r) for r in ("owner", *db_roles(settings))):
            await conn.execute(
                await conn.fetchval("SELECT format('DROP ROLE IF EXISTS %I', $1::text)", role)
            )
    finally:
        await conn.close()


def _rabbitmqctl(*args: str) -> None:
    argv = ["rabbitmqctl", "-q", *args]  # the run's own vhost and user names
    subprocess.run(argv, capture_output=True, timeout=60, check=False)  # noqa: S603
