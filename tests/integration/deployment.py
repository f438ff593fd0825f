"""A deployment with every role on its own account, made by ``saga setup``'s own code on the
machine's broker and database: a vhost of its own, users and Postgres roles with a prefix of
their own, removed at the end. Tests of who may do what run against it."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
import tempfile
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
from saga_shared.security.identity import Directory, db_role
from saga_shared.transport.bus import Bus


class Deployment:
    def __init__(self, base: Settings, run_id: str) -> None:
        self.run_id = run_id
        self.prefix = f"t{run_id}-"
        self.vhost = f"saga-t{run_id}"
        self.secrets = Path(tempfile.mkdtemp(prefix="saga-secrets-"))
        parts = urlsplit(base.amqp_url)
        # One namespace for the deployment: topic permissions name exchanges exactly, so the
        # role tests share it (each purges its queues when it ends).
        self.settings = base.with_(
            namespace=f"r{run_id}",
            amqp_url=urlunsplit(parts._replace(path=f"/{self.vhost}")),
            identity="roles",
            user_prefix=self.prefix,
            agents=f"{self.prefix}agent,{self.prefix}agent-2",
            people=f"{self.prefix}ana,{self.prefix}dana",
            secrets_dir=str(self.secrets),
        )
        self.admin_database_url = base.database_url
        self.directory = Directory.from_settings(self.settings)

    def user(self, name: str) -> str:
        """A role's or person's broker user: ``user("ana")``, ``user("inventory")``."""
        return f"{self.prefix}{name}"

    async def purge(self) -> None:
        """Empty the deployment's queues (as the coordinator), so no test feeds the next."""
        async with Bus(self.settings, user=self.user("coordinator")) as bus:
            channel = await bus.connection.channel()
            for name in bus.topology.all_queues():
                with contextlib.suppress(Exception):
                    queue = await channel.get_queue(name, ensure=False)
                    await queue.purge()
            await channel.close()

    async def create(self) -> None:
        report = Report()
        setup_broker(self.settings, "rabbitmqctl", report)
        await declare_topology(self.settings)
        passwords = database_passwords(self.settings)
        await setup_database(self.settings, self.admin_database_url, passwords, report)

    async def remove(self) -> None:
        users = [g.user for g in grants(self.settings)]
        await asyncio.to_thread(_rabbitmqctl, "delete_vhost", self.vhost)
        for user in users:
            await asyncio.to_thread(_rabbitmqctl, "delete_user", user)
        roles = [db_role(self.settings, r) for r in ("owner", *db_roles(self.settings))]
        conn = await asyncpg.connect(self.admin_database_url)
        try:
            admin = await conn.fetchval("SELECT current_user")
            for role in roles:
                with contextlib.suppress(asyncpg.UndefinedObjectError):
                    await conn.execute(
                        await conn.fetchval(
                            "SELECT format('REASSIGN OWNED BY %I TO %I', $1::text, $2::text)",
                            role,
                            admin,
                        )
                    )
                    await conn.execute(
                        await conn.fetchval("SELECT format('DROP OWNED BY %I', $1::text)", role)
                    )
        finally:
            await conn.close()
        conn = await asyncpg.connect(
            urlunsplit(urlsplit(self.admin_database_url)._replace(path="/postgres"))
        )
        try:
            for role in roles:
                await conn.execute(
                    await conn.fetchval("SELECT format('DROP ROLE IF EXISTS %I', $1::text)", role)
                )
        finally:
            await conn.close()
        shutil.rmtree(self.secrets, ignore_errors=True)


def _rabbitmqctl(*args: str) -> None:
    subprocess.run(["rabbitmqctl", "-q", *args], capture_output=True, timeout=60, check=False)
