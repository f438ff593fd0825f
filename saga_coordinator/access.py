"""Who may do what on the broker: one user per role with the narrowest permissions, written as
RabbitMQ definitions (users, a vhost, permissions, topic permissions).

``grants`` is the permission table (pure; docs/explanation/trust.md prints it).
``definitions`` turns it into the JSON RabbitMQ imports: with ``rabbitmqctl
import_definitions`` on the broker's machine, with
the management API's ``POST /api/definitions``, or as a file the broker loads at boot
(``load_definitions``, which is how docker compose uses it). Importing merges: running the set-up
again changes passwords and permissions to what they should be and creates what is missing.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import secrets
import subprocess
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from saga_coordinator.authority import command_keys
from saga_shared.config import Settings
from saga_shared.errors import ConfigError
from saga_shared.security.identity import Directory
from saga_shared.transport.topology import Topology

# An agent's topic permission on the commands exchange, from the one table of who may send what.
AGENT_COMMANDS = command_keys("agent")


@dataclass(frozen=True)
class Grant:
    """One user's permissions in the vhost: regular expressions on resource names, and on
    routing keys for the topic exchanges."""

    user: str
    role: str
    configure: str
    write: str
    read: str
    topics: tuple[tuple[str, str, str], ...] = ()  # (exchange, write keys, read keys)


def _names(settings: Settings) -> dict[str, str]:
    ns = re.escape(settings.namespace)
    return {
        "ns": ns,
        "commands": f"{ns}\\.commands",
        "events": f"{ns}\\.events",
        "partitions": f"{ns}\\.partitions",
        "outcomes": f"{ns}\\.outcomes",
        "dlx": f"{ns}\\.dlx",
    }


def grants(settings: Settings) -> list[Grant]:
    """The permission table. Clients (agents, operators, people, the console) may create only
    the queues they listen on (``amq.gen-*``, ``amq_<hex>``) and write only the commands exchange,
    under the routing keys of the commands their role may send; services only read their own
    action and request queues, write outcomes into the partitions (through the outcomes
    exchange, whose alternate is the partitions exchange), and bury a request past its
    delivery limit in the dead-letter exchange (a classic queue does not); only the
    coordinator, which owns the topology, configures anything."""
    n = _names(settings)
    d = Directory.from_settings(settings.with_(identity="roles"))
    commands, events = f"{settings.namespace}.commands", f"{settings.namespace}.events"
    every_command = r"^(saga|dlq)\..*"

    def client(user: str, role: str, command_keys: str, event_keys: str) -> Grant:
        # The queues a client listens on: server-named, or named as aio-pika's robust channels
        # name them (amq_ and 32 hex digits, so they survive a reconnection).
        own = r"amq\.gen-[A-Za-z0-9_-]+|amq_[0-9a-f]{32}"
        return Grant(
            user,
            role,
            configure=f"^({own})$",
            write=f"^({n['commands']}|{own})$",
            read=f"^({n['events']}|{own})$",
            topics=((commands, command_keys, "^$"), (events, "^$", event_keys)),
        )

    table = [
        Grant(
            d.user("coordinator"),
            "coordinator",
            configure=f"^{n['ns']}\\..*",
            write=f"^({n['ns']}\\..*|amq\\.default)$",
            read=f"^{n['ns']}\\..*",
            topics=((events, r"^(saga|step|alert)\..*", ".*"), (commands, every_command, ".*")),
        )
    ]
    for service in Topology.from_settings(settings).services:
        table.append(
            Grant(
                f"{d.prefix}{service}",
                service,
                configure="^$",
                write=f"^({n['partitions']}|{n['outcomes']}|{n['dlx']})$",
                read=f"^{n['ns']}\\.(action|request)\\.{re.escape(service)}$",
            )
        )
    table.append(client(d.user("ops"), "ops", every_command, ".*"))
    table.append(client(d.user("console"), "console", every_command, ".*"))
    agents = [a for a in d.agents if "*" not in a] or [d.agent_user]
    table += [client(a, "agent", AGENT_COMMANDS, r"^saga\..*") for a in agents]
    people = sorted(p.strip() for p in settings.people.split(",") if p.strip())
    table += [client(p, "person", every_command, ".*") for p in people]
    return table


def hash_password(password: str, salt: bytes | None = None) -> str:
    """RabbitMQ's ``rabbit_password_hashing_sha256``: base64(salt + sha256(salt + password))."""
    salt = os.urandom(4) if salt is None else salt
    return base64.b64encode(salt + hashlib.sha256(salt + password.encode()).digest()).decode()


def vhost_of(settings: Settings) -> str:
    path = urlsplit(settings.amqp_url).path
    return unquote(path[1:]) if len(path) > 1 else "/"


def password_variable(name: str) -> str:
    """``saga-inventory`` and the role ``saga_inventory``: ``SAGA_PASSWORD_SAGA_INVENTORY``."""
    return "SAGA_PASSWORD_" + re.sub(r"[^A-Za-z0-9]", "_", name).upper()


def ensure_passwords(directory: Path, kind: str, names: list[str]) -> dict[str, str]:
    """Each name's password: from ``SAGA_PASSWORD_<NAME>`` when the environment has it (a
    deployment that hands each container its own), else from ``directory/kind/<name>``; one
    that is nowhere is made (random, 32 characters). Written readable by its owner only."""
    folder = directory / kind
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    found = {}
    for name in names:
        path = folder / name
        given = os.environ.get(password_variable(name))
        if given or not path.exists():
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write((given or secrets.token_urlsafe(24)) + "\n")
        found[name] = path.read_text(encoding="utf-8").strip()
    return found


def definitions(settings: Settings, passwords: dict[str, str]) -> dict[str, Any]:
    vhost = vhost_of(settings)
    table = grants(settings)
    return {
        "rabbit_version": "3.10.0",
        "vhosts": [{"name": vhost}],
        "users": [
            {
                "name": g.user,
                "password_hash": hash_password(passwords[g.user]),
                "hashing_algorithm": "rabbit_password_hashing_sha256",
                "tags": [],
            }
            for g in table
        ],
        "permissions": [
            {
                "user": g.user,
                "vhost": vhost,
                "configure": g.configure,
                "write": g.write,
                "read": g.read,
            }
            for g in table
        ],
        "topic_permissions": [
            {"user": g.user, "vhost": vhost, "exchange": exchange, "write": write, "read": read}
            for g in table
            for exchange, write, read in g.topics
        ],
    }


def apply_with_rabbitmqctl(document: dict[str, Any], node: str | None = None) -> None:
    """Import on the broker's own machine (needs the Erlang cookie: root or the rabbitmq user)."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump(document, handle)
    try:
        os.chmod(handle.name, 0o644)  # the CLI may run as the rabbitmq user
        argv = ["rabbitmqctl", *(["-n", node] if node else []), "import_definitions", handle.name]
        # argv is fixed here; the file is ours
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)  # noqa: S603
    finally:
        os.unlink(handle.name)
    if done.returncode != 0:
        raise ConfigError(f"rabbitmqctl import_definitions failed: {done.stderr or done.stdout}")


def apply_with_http(document: dict[str, Any], admin_url: str) -> None:
    """Import through the management plugin: ``admin_url`` is http(s)://user:pass@host:15672."""
    parts = urlsplit(admin_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"broker admin URL {parts.scheme}://...: use http(s)://user:pass@host")
    base = f"{parts.scheme}://{parts.hostname}:{parts.port or 15672}"
    token = base64.b64encode(
        f"{unquote(parts.username or '')}:{unquote(parts.password or '')}".encode()
    ).decode()
    request = urllib.request.Request(  # noqa: S310 - the scheme is checked above
        f"{base}/api/definitions",
        data=json.dumps(document).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Basic {token}"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:  # noqa: S310
            answer.read()
    except OSError as exc:
        raise ConfigError(f"management API at {base}: {exc}") from None
