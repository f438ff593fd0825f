"""Settings, read once from the environment (``SAGA_*``); nothing secret lives in code.

The defaults point at the broker's and the database's local development accounts so a fresh
clone runs on a developer machine; production sets ``SAGA_AMQP_URL`` and ``SAGA_DATABASE_URL``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from shared.errors import ConfigError

_NAMESPACE = re.compile(r"^[a-z][a-z0-9_-]{0,40}$")
_SHARE = re.compile(r"^(\d+)/(\d+)$")
_PREFIX = re.compile(r"^[a-z][a-z0-9_-]{0,19}$")
_USER = re.compile(r"^[A-Za-z0-9_.@*-]{1,64}$")


@dataclass(frozen=True)
class Settings:
    amqp_url: str = "amqp://guest:guest@127.0.0.1:5672/"
    database_url: str = "postgresql://postgres@127.0.0.1:5432/saga"
    # Prefix of every exchange and queue: lets tests and several deployments share one vhost.
    namespace: str = "saga"
    # Changing the partition count re-routes orders: drain the partitions first.
    partitions: int = 8
    delivery_limit: int = 5
    catalog_path: str = ""
    max_message_bytes: int = 256 * 1024
    publish_timeout_s: float = 10.0
    adapter_prefetch: int = 32
    # The most action requests an adapter handles together (one statement, one confirm round,
    # one ack); 1 handles each alone.
    adapter_batch: int = 32
    partition_prefetch: int = 64
    relay_batch: int = 200
    relay_poll_s: float = 0.5
    # A row the coordinator wrote to publish itself, still there after this long, is the
    # relay's: its process died between the commit and the publish, or the broker was away.
    outbox_stale_s: float = 5.0
    # How often each consumer checks that the broker has not cancelled it.
    watchdog_s: float = 2.0
    deadline_poll_s: float = 0.5
    # How long a consumer holds a message while the database is unreachable before it gives up
    # on it (requeue, which counts towards the delivery limit).
    db_retry_s: float = 600.0
    # On SIGTERM, how long the deliveries in hand may take to finish before the process exits.
    stop_grace_s: float = 30.0
    # Which lifecycle events go to the public events exchange: comma-separated patterns of
    # event types. The default keeps the saga's own events and drops the per-step ones (six
    # of a refund's sixteen messages); "*" publishes them too. The register in Postgres
    # records every step either way.
    events: str = "saga.*"
    # With n coordinator processes, give each its own k/n: it takes the partitions p % n == k
    # and stands by for the others (subscribed standby_after_s later). "0/1": all of them.
    coordinator_share: str = "0/1"
    standby_after_s: float = 2.0
    # Who is who on the broker (see shared.identity). "roles": every component connects as its
    # own user and every message's sender is checked; "shared": one account for everything, for
    # a developer's machine and tests only (nothing is verified).
    identity: str = "roles"
    user_prefix: str = "saga-"
    # Agents' broker users (comma-separated, * allowed); empty: <prefix>agent and <prefix>agent-*.
    agents: str = ""
    # People's broker users (comma-separated): only they decide at gates and resolve.
    people: str = ""
    # Where the set-up wrote each role's password (rabbitmq/<user>, postgres/<role>); with it,
    # one process can run several components, each connected as its own role.
    secrets_dir: str = ""
    # Which account the CLI acts as when the secrets are there (a person's, or the ops user).
    act_as: str = ""
    # Commands per second each agent may send (a token bucket at the intake), and its burst.
    agent_rate: float = 50.0
    agent_burst: int = 200
    # The HTTP payments API: where `saga run payments-api` listens, where payments-http calls.
    payments_api_bind: str = "127.0.0.1:8090"
    payments_api_url: str = "http://127.0.0.1:8090"
    # Where `saga run` serves /metrics for Prometheus ("off": nowhere; one-shot commands never
    # do), and how often the coordinator reads the database's gauges.
    metrics_bind: str = "127.0.0.1:9464"
    metrics_poll_s: float = 10.0

    def __post_init__(self) -> None:
        self._check_events()
        self._check_identity()
        _check_url("SAGA_AMQP_URL", self.amqp_url, ("amqp", "amqps"))
        _check_url("SAGA_DATABASE_URL", self.database_url, ("postgresql", "postgres"))
        _check_url("SAGA_PAYMENTS_API_URL", self.payments_api_url, ("http", "https"))
        share = _SHARE.match(self.coordinator_share)
        if share is None or not int(share[1]) < int(share[2]) <= 1024:
            raise ConfigError(
                f"SAGA_COORDINATOR_SHARE {self.coordinator_share!r}: write k/n with 0 <= k < n"
            )
        if not _NAMESPACE.match(self.namespace):
            raise ConfigError(
                f"SAGA_NAMESPACE {self.namespace!r}: use [a-z][a-z0-9_-]*, at most 41"
            )
        if not 1 <= self.partitions <= 1024:
            raise ConfigError(f"SAGA_PARTITIONS {self.partitions}: must be between 1 and 1024")
        if not 1 <= self.delivery_limit <= 1000:
            raise ConfigError(f"SAGA_DELIVERY_LIMIT {self.delivery_limit}: must be 1..1000")
        if self.max_message_bytes < 1024:
            raise ConfigError("SAGA_MAX_MESSAGE_BYTES: must be at least 1024")
        for name in ("adapter_prefetch", "adapter_batch", "partition_prefetch", "relay_batch"):
            if not 1 <= getattr(self, name) <= 10_000:
                raise ConfigError(f"SAGA_{name.upper()}={getattr(self, name)}: must be 1..10000")
        for name in (
            "publish_timeout_s",
            "relay_poll_s",
            "watchdog_s",
            "deadline_poll_s",
            "stop_grace_s",
            "standby_after_s",
            "outbox_stale_s",
            "metrics_poll_s",
        ):
            if not 0 < getattr(self, name) <= 3600:
                raise ConfigError(
                    f"SAGA_{name.upper()}={getattr(self, name)}: must be in (0, 3600]"
                )

    def _check_identity(self) -> None:
        if self.identity not in ("roles", "shared"):
            raise ConfigError(f"SAGA_IDENTITY {self.identity!r}: use 'roles' or 'shared'")
        if not _PREFIX.match(self.user_prefix):
            raise ConfigError(
                f"SAGA_USER_PREFIX {self.user_prefix!r}: use [a-z][a-z0-9_-]*, at most 20"
            )
        for name, text in (("SAGA_AGENTS", self.agents), ("SAGA_PEOPLE", self.people)):
            for user in (u.strip() for u in text.split(",")):
                if user and not _USER.match(user):
                    raise ConfigError(f"{name}: {user!r} is not a user name ([A-Za-z0-9_.@*-])")
        if not 0 < self.agent_rate <= 1_000_000 or not 1 <= self.agent_burst <= 1_000_000:
            raise ConfigError("SAGA_AGENT_RATE must be in (0, 1e6], SAGA_AGENT_BURST in 1..1e6")

    def _check_events(self) -> None:
        from shared.messages import EVENT_TYPES  # messages do not need the settings

        for pattern in (p.strip() for p in self.events.split(",")):
            if pattern and not any(fnmatchcase(t, pattern) for t in EVENT_TYPES):
                raise ConfigError(
                    f"SAGA_EVENTS: {pattern!r} matches no event type "
                    f"(known: {', '.join(EVENT_TYPES)})"
                )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Every field ``x`` is read from ``SAGA_X``; explicit overrides win (CLI flags)."""
        source = os.environ if env is None else env
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = source.get(f"SAGA_{f.name.upper()}")
            if raw is None:
                continue
            values[f.name] = _convert(f.name, raw, type(getattr(cls, f.name)))
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def with_(self, **changes: Any) -> Settings:
        return replace(self, **changes)

    @property
    def catalog_file(self) -> Path:
        if self.catalog_path:
            return Path(self.catalog_path)
        return Path(__file__).with_name("catalog.toml")


def parse_bind(setting: str, text: str) -> tuple[str, int]:
    """``HOST:PORT`` (an IPv6 host in brackets) to listen on, or a ConfigError naming the
    setting."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{setting} {text!r}: write HOST:PORT, e.g. 127.0.0.1:8765")
    return host.strip("[]"), int(port)


def masked(url: str) -> str:
    """The URL with its password replaced by stars, to print."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    return url.replace(f":{parts.password}@", ":******@", 1)


def _check_url(name: str, url: str, schemes: tuple[str, ...]) -> None:
    """A URL the clients can use, or an error naming what is wrong (never the password)."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a port that is not a number in range
    except ValueError as exc:
        raise ConfigError(f"{name} {masked(url)!r}: {exc}") from None
    if parts.scheme not in schemes:
        raise ConfigError(f"{name} {masked(url)!r}: the scheme must be one of {', '.join(schemes)}")
    if not parts.hostname and "host=" not in parts.query:
        raise ConfigError(f"{name} {masked(url)!r}: no host")


def _convert(name: str, raw: str, kind: type) -> Any:
    try:
        if kind is int:
            return int(raw)
        if kind is float:
            return float(raw)
    except ValueError:
        raise ConfigError(f"SAGA_{name.upper()}={raw!r}: expected a {kind.__name__}") from None
    return raw
