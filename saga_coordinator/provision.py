"""``saga setup``: the one place that uses administrator rights. It creates each role's broker
user and Postgres role (passwords from the secrets directory, made when missing), imports the
broker permissions, declares the topology as the coordinator, migrates the database as its
owner and grants each role what it needs. Idempotent: run it again after an upgrade."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from saga_coordinator.access import (
    apply_with_http,
    apply_with_rabbitmqctl,
    definitions,
    ensure_passwords,
    grants,
)
from saga_shared.config import Settings
from saga_shared.security.identity import COMPONENT_ROLES, Directory, db_role, with_credentials
from saga_shared.storage.migrations import migrate
from saga_shared.storage.sql import Queries
from saga_shared.transport.bus import Bus
from saga_shared.transport.topology import SERVICES, Topology

Q = Queries(Path(__file__).with_name("setup.sql"))
DB_ROLES: tuple[str, ...] = (*(r for r in COMPONENT_ROLES if r not in ("ops", "console")),
                             "reader", "operator")  # fmt: skip
BrokerMethod = Literal["rabbitmqctl", "http", "file", "none"]


@dataclass
class Report:
    broker_users: list[str] = field(default_factory=list)
    broker_method: str = ""
    definitions_file: str | None = None
    database_roles: list[str] = field(default_factory=list)
    migrations: list[str] = field(default_factory=list)
    secrets_dir: str = ""


def _secrets(settings: Settings) -> Path:
    if not settings.secrets_dir:
        raise ValueError("set SAGA_SECRETS_DIR (or --secrets-dir): where each role's password goes")
    return Path(settings.secrets_dir)


def setup_broker(
    settings: Settings,
    method: BrokerMethod,
    report: Report,
    *,
    admin_url: str | None = None,
    definitions_out: Path | None = None,
) -> None:
    """Users and permissions: imported into the broker, or only written to a file."""
    users = [g.user for g in grants(settings)]
    passwords = ensure_passwords(_secrets(settings), "rabbitmq", users)
    document = definitions(settings, passwords)
    if method == "rabbitmqctl":
        apply_with_rabbitmqctl(document)
    elif method == "http":
        if not admin_url:
            raise ValueError("--broker http needs --broker-admin-url (SAGA_BROKER_ADMIN_URL)")
        apply_with_http(document, admin_url)
    if definitions_out is not None:
        definitions_out.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
        definitions_out.chmod(0o600)
        report.definitions_file = str(definitions_out)
    report.broker_users, report.broker_method = users, method


async def declare_topology(settings: Settings) -> None:
    """Declared as the coordinator, which owns it (and is the only role that may)."""
    roles = settings.with_(identity="roles")
    async with Bus(roles, user=Directory.from_settings(roles).user("coordinator")) as bus:
        await bus.declare()


def default_broker_method() -> BrokerMethod:
    return "rabbitmqctl" if shutil.which("rabbitmqctl") else "none"


def _database_name(url: str) -> str:
    return urlsplit(url).path.lstrip("/") or "saga"


def database_passwords(settings: Settings) -> dict[str, str]:
    names = [db_role(settings, role) for role in ("owner", *db_roles(settings))]
    return ensure_passwords(_secrets(settings), "postgres", names)


def own_services(settings: Settings) -> list[str]:
    """The catalog's services other than the four built-in ones."""
    return [s for s in Topology.from_settings(settings).services if s not in SERVICES]


def db_roles(settings: Settings) -> tuple[str, ...]:
    """Every Postgres role but the owner: the built-in ones and one per service of one's own."""
    return (*DB_ROLES, *own_services(settings))


async def setup_database(
    settings: Settings, admin_url: str, passwords: dict[str, str], report: Report
) -> None:
    """Roles, the database owned by the owner role, migrations run as the owner, then grants."""
    names = {role: db_role(settings, role) for role in ("owner", *db_roles(settings))}
    database = _database_name(settings.database_url)
    admin = await asyncpg.connect(urlunsplit(urlsplit(admin_url)._replace(path="/postgres")))
    try:
        for name in names.values():
            query = Q.role_alter if await admin.fetchval(Q.role_exists, name) else Q.role_create
            await admin.execute(await admin.fetchval(query, name, passwords[name]))
        if await admin.fetchval(Q.database_owner, database) is None:
            await admin.execute(await admin.fetchval(Q.database_create, database, names["owner"]))
        others = [n for r, n in names.items() if r != "owner"]
        for statement in await admin.fetch(Q.database_grants, database, names["owner"], others):
            await admin.execute(statement[0])
    finally:
        await admin.close()
    in_db = urlunsplit(urlsplit(admin_url)._replace(path=f"/{database}"))
    admin = await asyncpg.connect(in_db)
    try:
        for statement in await admin.fetch(Q.schema_grants, names["owner"], list(names.values())):
            await admin.execute(statement[0])
    finally:
        await admin.close()
    owner_url = with_credentials(settings.database_url, names["owner"], passwords[names["owner"]])
    report.migrations = await migrate(owner_url)
    admin = await asyncpg.connect(in_db)
    try:
        await admin.execute(Q.grant_roles, settings.user_prefix.replace("-", "_"))
        for service in own_services(settings):  # what a service's adapter itself writes
            for statement in await admin.fetch(Q.service_grants, names[service], service):
                await admin.execute(statement[0])
    finally:
        await admin.close()
    report.database_roles = list(names.values())
