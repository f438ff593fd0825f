"""Who is who: the broker users of a deployment, their roles, and the credentials each component
connects with.

Trust comes from the broker, not from the body. Every publisher sets the AMQP ``user_id``
property and RabbitMQ refuses a publish whose ``user_id`` is not the connection's own user, so
``user_id`` on a delivery is the sender as the broker authenticated it. The directory maps that
user to a role (``roles`` mode), and the consumers check the role against what the message
claims to be: an outcome only from the service that owns the action, a command only from an
agent, an operator or a person, a person's decision only from a person.

``shared`` mode (one account for everything) exists for tests and a developer's laptop: every
check passes for the one account, so nothing is verified; a process says so when it starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Literal
from urllib.parse import quote, unquote, urlsplit

from saga_shared.addresses import with_netloc_credentials
from saga_shared.config import Settings
from saga_shared.errors import ConfigError
from saga_shared.model.catalog import service_of
from saga_shared.model.messages import Role

# The roles a process connects as; agents and people have accounts of their own.
Component = Literal["coordinator", "inventory", "erp", "payments", "email", "ops", "console"]
COMPONENT_ROLES: tuple[Component, ...] = (
    "coordinator", "inventory", "erp", "payments", "email", "ops", "console",
)  # fmt: skip
COMMAND_ROLES: frozenset[Role] = frozenset({"agent", "ops", "person", "console"})


# The user aiormq logs in as when the URL names none (``aiormq.auth``, with password guest).
DEFAULT_LOGIN = "guest"


def user_of_url(url: str) -> str:
    """The broker user a connection to ``url`` logs in as, which the broker holds every
    message's ``user_id`` to: a URL without one (``amqp://host/``) logs in as guest, and its
    commands stamped with no user were refused as forged, unanswered."""
    name = urlsplit(url).username
    return unquote(name) if name else DEFAULT_LOGIN


def with_credentials(url: str, user: str, password: str | None) -> str:
    """``url`` with its user (and password) replaced; every host, port, path and query kept."""
    credentials = quote(user, safe="")
    if password is not None:
        credentials += ":" + quote(password, safe="")
    return with_netloc_credentials(url, credentials + "@")


@dataclass(frozen=True)
class Directory:
    mode: Literal["roles", "shared"]
    prefix: str
    agents: tuple[str, ...]
    people: frozenset[str]
    shared_user: str = DEFAULT_LOGIN  # the one account of ``shared`` mode

    @classmethod
    def from_settings(cls, settings: Settings) -> Directory:
        prefix = settings.user_prefix
        agents = tuple(a.strip() for a in settings.agents.split(",") if a.strip()) or (
            f"{prefix}agent",
            f"{prefix}agent-*",
        )
        people = frozenset(p.strip() for p in settings.people.split(",") if p.strip())
        mode: Literal["roles", "shared"] = "shared" if settings.identity == "shared" else "roles"
        return cls(mode, prefix, agents, people, user_of_url(settings.amqp_url))

    @property
    def verifies(self) -> bool:
        return self.mode == "roles"

    def user(self, role: Component) -> str:
        """The broker user a component of this role connects as."""
        if self.mode == "shared":
            return self.shared_user
        return f"{self.prefix}{role}"

    @property
    def agent_user(self) -> str:
        """The first agent account named in full (the demo and the benchmark act as it)."""
        if self.mode == "shared":
            return self.shared_user
        return next((a for a in self.agents if "*" not in a), f"{self.prefix}agent")

    def role_of(self, user: str | None) -> Role | None:
        """The role of a verified user, or None (unknown, or no user_id: unauthenticated)."""
        if user is None:
            return None
        if self.mode == "shared":
            return "person" if user == self.shared_user else None
        if user in self.people:
            return "person"
        for role in COMPONENT_ROLES:
            if user == f"{self.prefix}{role}":
                return role
        if any(fnmatchcase(user, pattern) for pattern in self.agents):
            return "agent"
        return None

    def is_coordinator(self, user: str | None) -> bool:
        return user is not None and user == self.user("coordinator")

    def owns(self, user: str | None, action: str) -> bool:
        """Whether ``user`` is the service that performs ``action`` (``service.name``)."""
        service = service_of(action)
        if user is None:
            return False
        if self.mode == "shared":
            return user == self.shared_user
        return user == f"{self.prefix}{service}"

    def command_role(self, user: str | None) -> Role | None:
        """The role a command's sender acts in, or None when it may send no command."""
        role = self.role_of(user)
        return role if role in COMMAND_ROLES else None


def read_secret(settings: Settings, kind: Literal["rabbitmq", "postgres"], name: str) -> str | None:
    """A role's password as the set-up wrote it, or None without a secrets directory."""
    if not settings.secrets_dir:
        return None
    path = Path(settings.secrets_dir) / kind / name
    try:
        return path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        raise ConfigError(
            f"no password for {name!r}: {path} is missing (run `saga setup`)"
        ) from None
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None


def amqp_url_for(settings: Settings, user: str) -> str:
    """The broker URL to connect as ``user``: the configured URL, with that user's password from
    the secrets directory when there is one."""
    if settings.identity == "shared" or not settings.secrets_dir:
        return settings.amqp_url
    return with_credentials(settings.amqp_url, user, read_secret(settings, "rabbitmq", user))


def db_role(settings: Settings, role: str) -> str:
    """The Postgres role of a component: ``saga_coordinator`` for prefix ``saga-``."""
    return settings.user_prefix.replace("-", "_") + role


def database_url_for(settings: Settings, role: str) -> str:
    if settings.identity == "shared" or not settings.secrets_dir:
        return settings.database_url
    name = db_role(settings, role)
    secret = Path(settings.secrets_dir) / "postgres" / name
    password = read_secret(settings, "postgres", name) if secret.exists() else None
    return with_credentials(settings.database_url, name, password)


def check_connects_as(settings: Settings, user: str, what: str) -> None:
    """In roles mode a component must connect as its own user: refuse to start otherwise, with
    what to do about it, rather than have every message it sends refused as forged."""
    if settings.identity == "shared":
        return
    actual = user_of_url(amqp_url_for(settings, user))
    if actual != user:
        raise ConfigError(
            f"{what} must connect to RabbitMQ as {user!r}, but SAGA_AMQP_URL names "
            f"{actual!r}: run `saga setup` and set SAGA_SECRETS_DIR, give this process its own "
            "SAGA_AMQP_URL, or use SAGA_IDENTITY=shared on a development broker"
        )
