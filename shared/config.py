"""Settings, read once from the environment (``SAGA_*``); nothing secret lives in code.

pydantic-settings reads the variables (``SAGA_`` and the field's name, in capitals) and
pydantic checks them; a value it refuses is a ``ConfigError`` of one line that names the
variable, never a traceback. The defaults point at the broker's and the database's local
development accounts so a fresh clone runs on a developer machine; production sets
``SAGA_AMQP_URL`` and ``SAGA_DATABASE_URL``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import parse_qs, urlsplit

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Strict,
    ValidationError,
    ValidatorFunctionWrapHandler,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from saga_shared.addresses import one_per_host
from saga_shared.errors import ConfigError

_NAMESPACE = re.compile(r"^[a-z][a-z0-9_-]{0,40}$")
_SHARE = re.compile(r"^(\d+)/(\d+)$")
_PREFIX = re.compile(r"^[a-z][a-z0-9_-]{0,19}$")
_USER = re.compile(r"^[A-Za-z0-9_.@*-]{1,64}$")
# urllib drops tabs and newlines from a URL without a word, and other clients choke on the rest:
# a URL with any of them is not the URL that was meant.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
_PASSWORD = re.compile(r"(://[^:/@]*:)[^@]*@")


class _Rule(ValueError):
    """A setting's value breaks a rule. ``of_item``: the message names the one item of a list
    that is wrong, so the whole value is not repeated."""

    def __init__(self, problem: str, *, of_item: bool = False) -> None:
        super().__init__(problem)
        self.of_item = of_item


def _read_as(kind: type[int] | type[float]) -> BeforeValidator:
    def convert(value: object) -> object:
        if not isinstance(value, str):
            return value
        # Python's own reading of a number: pydantic's lax mode takes "8.0" as the count 8.
        try:
            return kind(value)
        except ValueError:
            raise _Rule(f"expected a {kind.__name__}") from None

    return BeforeValidator(convert)


def _check(test: Callable[[Any], bool], problem: str) -> AfterValidator:
    def check(value: Any) -> Any:
        if not test(value):
            raise _Rule(problem)
        return value

    return AfterValidator(check)


Whole = Annotated[int, Strict(), _read_as(int)]
Real = Annotated[float, Strict(), _read_as(float)]
Count = Annotated[Whole, _check(lambda n: 1 <= n <= 10_000, "must be between 1 and 10000")]
Seconds = Annotated[Real, _check(lambda s: 0 < s <= 3600, "must be more than 0 and at most 3600")]
Millis = Annotated[Real, _check(lambda s: 0 <= s <= 1000, "must be between 0 and 1000")]


def _url(*schemes: str) -> AfterValidator:
    def check(url: str) -> str:
        _check_url(url, schemes)
        return url

    return AfterValidator(check)


def _users(text: str) -> str:
    for user in (u.strip() for u in text.split(",")):
        if user and not _USER.match(user):
            raise _Rule(f"{user!r} is not a user name ([A-Za-z0-9_.@*-])", of_item=True)
    return text


def _events(text: str) -> str:
    from saga_shared.model.messages import EVENT_TYPES  # messages do not need the settings

    for pattern in (p.strip() for p in text.split(",")):
        if pattern and not any(fnmatchcase(t, pattern) for t in EVENT_TYPES):
            raise _Rule(
                f"{pattern!r} matches no event type (known: {', '.join(EVENT_TYPES)})",
                of_item=True,
            )
    return text


def _share(text: str) -> str:
    share = _SHARE.match(text)
    if share is None or not int(share[1]) < int(share[2]) <= 1024:
        raise _Rule("write k/n with 0 <= k < n <= 1024")
    return text


Users = Annotated[str, AfterValidator(_users)]


class Settings(BaseSettings):
    """Every field ``x`` is the variable ``SAGA_X``. Built directly, it holds its defaults and
    what it is given, nothing from the environment (tests and the test kit rely on that);
    ``from_env`` reads the environment. Frozen: ``with_`` makes a changed, checked copy."""

    model_config = SettingsConfigDict(env_prefix="SAGA_", frozen=True, extra="forbid")

    # RabbitMQ; a cluster's nodes as amqp://u:p@mq1:5672,mq2:5672/ (TLS: amqps://...?cafile=).
    amqp_url: Annotated[str, _url("amqp", "amqps")] = "amqp://guest:guest@127.0.0.1:5672/"
    # Postgres (`saga migrate` creates the database); a primary and standbys as
    # postgresql://u@db1:5432,db2:5432/saga?target_session_attrs=read-write.
    database_url: Annotated[str, _url("postgresql", "postgres")] = (
        "postgresql://postgres@127.0.0.1:5432/saga"
    )
    # Prefix of every exchange and queue: lets tests and several deployments share one vhost.
    namespace: Annotated[
        str, _check(_NAMESPACE.match, "use [a-z][a-z0-9_-]*, at most 41 characters")
    ] = "saga"
    # Changing the partition count re-routes orders: drain the partitions first.
    partitions: Annotated[Whole, _check(lambda n: 1 <= n <= 1024, "must be between 1 and 1024")] = 8
    # Deliveries of one message before it is dead-lettered: a quorum queue's x-delivery-limit;
    # on a classic request queue the adapter counts (a message is handled at most this + 1 times).
    delivery_limit: Annotated[
        Whole, _check(lambda n: 1 <= n <= 1000, "must be between 1 and 1000")
    ] = 5
    # How many nodes of a RabbitMQ cluster hold each queue it declares (quorum queues'
    # x-quorum-initial-group-size); 0: the broker's default, every node up to its limit.
    # Set it before the first declaration: the broker refuses to declare an existing queue
    # with another value (PRECONDITION_FAILED); `rabbitmq-queues grow` adds members later.
    quorum_size: Annotated[Whole, _check(lambda n: 0 <= n <= 99, "must be between 0 and 99")] = 0
    # The catalog of actions and sagas (TOML); empty: the built-in shared/catalog.toml.
    catalog_path: str = ""
    # Larger message bodies are refused.
    max_message_bytes: Annotated[Whole, _check(lambda n: n >= 1024, "must be at least 1024")] = (
        256 * 1024
    )
    # A publish waiting for its confirm gives up after this.
    publish_timeout_s: Seconds = 10.0
    # The broker's prefetch for an adapter's consumer.
    adapter_prefetch: Count = 32
    # The most action requests an adapter handles together (one statement, one confirm round,
    # one ack); 1 handles each alone.
    adapter_batch: Count = 32
    # The broker's prefetch for a coordinator's partition consumer.
    partition_prefetch: Count = 64
    # The most messages a partition hands to one group commit: those at its head, of distinct
    # orders; 1 hands them one at a time.
    partition_batch: Count = 32
    # How many such batches a partition has in hand at once: the next is handed in while the
    # one before commits (never two messages of one order); 1 waits for each batch's outcome.
    # 3 against 2: 317.6 -> 329.0 refunds/s at 64 in flight, alternating rounds (none at 256).
    partition_depth: Count = 3
    # How long a batch (a group commit, an adapter's batch) waits for more messages before it starts
    # (``saga_shared.transport.linger``): the last batch's size times the per-message figure, at
    # most the first; nothing after a batch of one, so concurrency 1 never waits. 0: never wait.
    # Against 0 (refunds, alternating rounds): at 256 in flight 367.6 -> 393.4 sagas/s, 4.71 -> 4.25
    # ms CPU a saga; at 64 CPU 7.51 -> 7.18 ms, sagas/s within the noise. A flat 5 ms saved more CPU
    # at 64 but cost sagas/s at 16 (a small batch waits less here).
    batch_linger_ms: Millis = 5.0
    batch_linger_per_message_ms: Millis = 0.5
    # The AMQP frames queued together go out in one socket write
    # (``saga_shared.amqp_internals.frames``).
    coalesce_frames: bool = True
    # The frames every message crosses coded directly instead of by pamqp
    # (``saga_shared.amqp_internals.wire``).
    fast_frames: bool = True
    # The outbox relay's batch, and its fallback poll (also how often a standby relay asks
    # for the relay lock).
    relay_batch: Count = 200
    relay_poll_s: Seconds = 0.5
    # A row the coordinator wrote to publish itself, still there after this long, is the
    # relay's: its process died between the commit and the publish, or the broker was away.
    outbox_stale_s: Seconds = 5.0
    # How often each consumer checks that the broker has not cancelled it.
    watchdog_s: Seconds = 2.0
    # How often due step deadlines and gate timeouts are fired.
    deadline_poll_s: Seconds = 0.5
    # How long a consumer holds a message while the database is unreachable before it gives up
    # on it (requeue, which counts towards the delivery limit).
    db_retry_s: Real = 600.0
    # Postgres's plan_cache_mode for the coordinator's and the adapters' connections. Their
    # statements take arrays of a batch, for which "auto" plans again at every execution
    # (half of the database's CPU for a claim); the generic plan is the same shape (index
    # lookups per element) and is planned again when autovacuum analyzes a table.
    db_plan_cache_mode: Literal["auto", "force_generic_plan", "force_custom_plan"] = (
        "force_generic_plan"
    )
    # A group whose every message finds its order and saga as this coordinator last wrote them
    # is decided without reading and written in one statement that checks they still are
    # (``saga_coordinator.guarded``); off: every group is a transaction that reads under locks.
    guarded_apply: bool = True
    # On SIGTERM, how long the deliveries in hand may take to finish before the process exits.
    stop_grace_s: Seconds = 30.0
    # Which lifecycle events go to the public events exchange: comma-separated patterns of
    # event types. The default keeps the saga's own events and drops the per-step ones (six
    # of a refund's sixteen messages); "*" publishes them too. The register in Postgres
    # records every step either way.
    events: Annotated[str, AfterValidator(_events)] = "saga.*"
    # With n coordinator processes, give each its own k/n: it takes the partitions p % n == k
    # and stands by for the others (subscribed standby_after_s later). "0/1": all of them.
    coordinator_share: Annotated[str, AfterValidator(_share)] = "0/1"
    # How long a coordinator waits before it subscribes to the partitions outside its share.
    standby_after_s: Seconds = 2.0
    # A coordinator owns a partition while its lock session lives (saga_coordinator.ownership):
    # a process that stops looking (frozen) loses its partitions this long after its last look
    # (never less than three looks, SAGA_WATCHDOG_S each). Every broker connection asks for a
    # heartbeat of half of it, so the broker drops a frozen process's consumers as its locks pass.
    partition_lease_s: Seconds = 10.0
    # Who is who on the broker (see saga_shared.security.identity). "roles": every component
    # connects as its own user and every message's sender is checked; "shared": one account for
    # everything, for a developer's machine and tests only (nothing is verified).
    identity: Literal["roles", "shared"] = "roles"
    # "in-process": a process that runs the coordinator and adapters together (``saga run``,
    # shared identity only) hands requests and outcomes to its own consumers instead of
    # publishing them (saga_shared.transport.handoff); "broker": everything through RabbitMQ.
    handoff: Literal["broker", "in-process"] = "broker"
    # Role users are <prefix>coordinator, <prefix>inventory, ..., <prefix>ops; Postgres roles
    # the same with "_".
    user_prefix: Annotated[
        str, _check(_PREFIX.match, "use [a-z][a-z0-9_-]*, at most 20 characters")
    ] = "saga-"
    # Agents' broker users (comma-separated, * allowed); empty: <prefix>agent and <prefix>agent-*.
    agents: Users = ""
    # People's broker users (comma-separated): only they decide at gates and resolve.
    people: Users = ""
    # Where the set-up wrote each role's password (rabbitmq/<user>, postgres/<role>); with it,
    # one process can run several components, each connected as its own role.
    secrets_dir: str = ""
    # Which account the CLI acts as when the secrets are there (a person's, or the ops user).
    act_as: str = ""
    # Commands per second each agent may send (a token bucket at the intake), and its burst.
    agent_rate: Annotated[
        Real, _check(lambda r: 0 < r <= 1_000_000, "must be more than 0 and at most 1000000")
    ] = 50.0
    agent_burst: Annotated[
        Whole, _check(lambda n: 1 <= n <= 1_000_000, "must be between 1 and 1000000")
    ] = 200
    # The HTTP payments API: where `saga run payments-api` listens, where payments-http calls.
    payments_api_bind: str = "127.0.0.1:8090"
    payments_api_url: Annotated[str, _url("http", "https")] = "http://127.0.0.1:8090"
    # Where `saga run` serves /metrics for Prometheus ("off": nowhere; one-shot commands never
    # do), and how often the coordinator reads the database's gauges.
    metrics_bind: str = "127.0.0.1:9464"
    metrics_poll_s: Seconds = 10.0
    # Whether the adapters of your own services take the faults of `saga faults add` (for
    # rehearsals: one more statement per call; the simulated systems always take them).
    inject_faults: bool = False
    # How often each coordinator and adapter writes its row of `processes` (the console's
    # Health page); one that has not written for three of these is shown as silent.
    heartbeat_s: Seconds = 5.0

    @model_validator(mode="wrap")
    @classmethod
    def _one_line(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        """Whatever pydantic refuses becomes a ConfigError naming the variable."""
        try:
            return handler(data)
        except ValidationError as exc:
            raise ConfigError(_describe(exc)) from None

    @model_validator(mode="after")
    def _handoff_in_one_account(self) -> Settings:
        if self.handoff == "in-process" and self.identity != "shared":
            raise ConfigError(
                "SAGA_HANDOFF=in-process needs SAGA_IDENTITY=shared: a message handed over in "
                f"the process skips the broker's check of who sent it (SAGA_IDENTITY is "
                f"{self.identity!r})"
            )
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)  # the environment only through from_env

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """The ``SAGA_*`` variables of ``env`` (default: the process's), then the overrides that
        are not None (CLI flags). The environment is checked in full before the overrides
        apply: a typo there never hides behind a flag."""
        read = _Variables(cls, os.environ if env is None else env)()
        settings = cls(**read)
        chosen = {k: v for k, v in overrides.items() if v is not None}
        return settings.with_(**chosen) if chosen else settings

    @property
    def lease_s(self) -> float:
        """How long a process that stopped (frozen) keeps what it holds in Postgres: its
        partition and relay locks, and the row locks of a transaction it had open.
        ``partition_lease_s``, and never under three looks."""
        return max(self.partition_lease_s, 3 * self.watchdog_s)

    def with_(self, **changes: Any) -> Settings:
        """A copy with ``changes``, checked like the original (``model_copy`` checks nothing)."""
        return type(self)(**{**self.model_dump(), **changes})

    @property
    def catalog_file(self) -> Path:
        if self.catalog_path:
            return Path(self.catalog_path)
        return Path(__file__).with_name("catalog.toml")


class _Variables(EnvSettingsSource):
    """pydantic-settings' reading of the environment, from a mapping given (tests pass one)."""

    def __init__(self, settings_cls: type[BaseSettings], env: Mapping[str, str]) -> None:
        self._given = env
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        # The names as documented, in capitals only: pydantic-settings would read saga_x too.
        return {k.lower(): v for k, v in self._given.items() if k == k.upper()}


def _describe(exc: ValidationError) -> str:
    """One line: each refused setting as ``SAGA_X=value: problem`` (a URL's password masked)."""
    said = []
    for error in exc.errors():
        name = f"SAGA_{str(error['loc'][0]).upper()}" if error["loc"] else "settings"
        cause = error.get("ctx", {}).get("error")
        if isinstance(cause, _Rule) and cause.of_item:
            said.append(f"{name}: {cause}")
            continue
        problem = str(cause) if isinstance(cause, _Rule) else error["msg"]
        if error["type"] == "extra_forbidden":
            problem = "there is no such setting"
        value = error.get("input")
        shown = repr(masked(value) if isinstance(value, str) else value)
        # a 10,000-digit number is refused as well in 80 characters
        said.append(f"{name}={shown if len(shown) <= 80 else shown[:79] + '…'}: {problem}")
    return "; ".join(said)


def parse_bind(setting: str, text: str) -> tuple[str, int]:
    """``HOST:PORT`` (an IPv6 host in brackets) to listen on, or a ConfigError naming the
    setting."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{setting} {text!r}: write HOST:PORT, e.g. 127.0.0.1:8765")
    return host.strip("[]"), int(port)


def masked(url: str) -> str:
    """The URL with its password replaced by stars, to print."""
    try:
        password = urlsplit(url).password
    except ValueError:  # not a URL urllib can read: hide what looks like a password anyway
        return _PASSWORD.sub(r"\1******@", url, count=1)
    if password is None:
        return url
    return url.replace(f":{password}@", ":******@", 1)


_SSLMODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")


def _check_url(url: str, schemes: tuple[str, ...]) -> None:
    """A URL the clients can use, or the reason it is not (the caller names the setting)."""
    control = _CONTROL.search(url)
    if control is not None:
        raise _Rule(f"a control character (U+{ord(control.group()):04X}) in the URL")
    for one in one_per_host(url):  # several hosts: a cluster, or a primary and standbys
        try:
            parts = urlsplit(one)
            parts.port  # noqa: B018 - raises on a port that is not a number in range
        except ValueError as exc:
            raise _Rule(str(exc)) from None
        if parts.scheme not in schemes:
            raise _Rule(f"the scheme must be one of {', '.join(schemes)}")
        if not parts.hostname and "host=" not in parts.query:
            raise _Rule("no host")
        # asyncpg refuses a bad sslmode only when it connects, without naming the setting.
        for mode in parse_qs(parts.query).get("sslmode", []):
            if mode not in _SSLMODES:
                raise _Rule(f"sslmode={mode!r}: use one of {', '.join(_SSLMODES)}")
        # aiormq reads a bad or negative heartbeat as 0, no heartbeat at all: a frozen
        # coordinator would then keep its partition queues for as long as it stays frozen.
        for beat in parse_qs(parts.query).get("heartbeat", []):
            if not (beat.isdigit() and 1 <= int(beat) <= 65534):
                raise _Rule(f"heartbeat={beat!r}: a whole number of seconds, 1 to 65534")
