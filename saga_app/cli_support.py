"""Helpers shared by the ``saga`` command groups."""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import Any, TypeVar

import asyncpg
import click
from aiormq.exceptions import AMQPConnectionError, AMQPError
from click.core import ParameterSource
from pydantic import ValidationError

from saga_app.output import dump
from saga_coordinator.store import Store
from saga_shared import loop
from saga_shared.client import BrokerUnreachable, CommandRejected, NotAnswered
from saga_shared.config import Settings, masked
from saga_shared.errors import SagaError
from saga_shared.model.text import clean
from saga_shared.security.identity import Directory, database_url_for
from saga_shared.transport.bus import Bus
from saga_shared.transport.codec import describe

T = TypeVar("T")
EXIT_REFUSED = 2
EXIT_TIMEOUT = 3
EXIT_STOPPED = 4  # --wait: the saga stopped at a gate, waiting for a person
# Sent, and queued (or perhaps queued), but not answered in time: it applies when the
# coordinator runs, and sending it again with the same message id is safe.
EXIT_NOT_ANSWERED = 5
ANSWER_WITHIN_S = 10.0  # a command without --wait: how long it may take, answer included
MIN_ANSWER_S = 1.0  # however little --wait leaves, the time given to connect and be answered
_OVERRIDES, _SETTINGS = "saga.overrides", "saga.settings"


class SagaGroup(click.Group):
    """The ``saga`` group: whatever error a command ends with is shown as one line, control
    characters escaped (an ID or a reason that someone else chose is part of many errors, and
    must not be able to rewrite what the operator's terminal shows)."""

    def make_context(
        self, info_name: str | None, args: list[str], parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:  # fmt: skip
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.BadParameter as exc:
            raise (from_environment(exc) or exc) from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.ClickException as exc:
            named = from_environment(exc)
            if named is not None:
                raise named from None
            said = exc.format_message()
            if one_line(said) == said or isinstance(exc, click.exceptions.NoArgsIsHelpError):
                raise  # (a group without its command shows its help, lines and all)
            if isinstance(exc, click.UsageError):
                raise click.UsageError(one_line(said), exc.ctx) from None
            raise click.ClickException(one_line(said)) from None


def from_environment(exc: click.ClickException) -> click.ClickException | None:
    """A bad value read from a variable is a bad setting, as every other: one line naming the
    variable, exit 1; no usage text, since nothing on the command line was wrong."""
    param = getattr(exc, "param", None)
    ctx = getattr(exc, "ctx", None)
    if not isinstance(exc, click.BadParameter) or param is None or ctx is None or not param.name:
        return None
    if ctx.get_parameter_source(param.name) is not ParameterSource.ENVIRONMENT:
        return None
    variable = param.envvar if isinstance(param.envvar, str) else param.envvar[0]
    value = os.environ.get(variable, "")
    shown = clean(value, 40)  # a 10,000-digit value is not echoed whole, here or in the reason
    reason = exc.message.replace(value, shown) if value else exc.message
    return click.ClickException(one_line(f"{variable}='{shown}': {reason}"))


def one_line(text: str) -> str:
    return " ".join(clean(text, 4000).splitlines())


class Seconds(click.FloatRange):
    """How long to wait: up to a day; NaN, which every range check lets through, refused."""

    name = "seconds"

    def __init__(self) -> None:
        super().__init__(min=0, max=86_400)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        seconds = super().convert(value, param, ctx)
        if math.isnan(seconds):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        return seconds


class Deadline:
    """The bound of a whole command that sends one: ``--wait`` seconds from now (connecting,
    sending and resending, the answer, the outcome), or ``ANSWER_WITHIN_S`` without it."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds = ANSWER_WITHIN_S if seconds is None else seconds
        self._end = time.monotonic() + self.seconds

    def left(self) -> float:
        return max(0.0, self._end - time.monotonic())

    def for_answer(self) -> float:
        """What is left for connecting and the answer (never less than MIN_ANSWER_S)."""
        return max(self.left(), MIN_ANSWER_S)


@contextlib.contextmanager
def client_outcomes(
    as_json: bool,
    unanswered: Callable[[NotAnswered], str],
    *,
    follow: str | None = None,
    ids: dict[str, str] | None = None,
) -> Iterator[None]:
    """A command sent and not answered: ``unanswered``'s paragraph on stderr (and, with
    ``--json``, the facts and the command to ``follow`` it with on stdout), exit
    ``EXIT_NOT_ANSWERED``. The broker out of reach (nothing sent): one line naming its URL
    (and, with ``--json``, the facts, with the ``ids`` the command would have had), exit 1."""
    try:
        yield
    except NotAnswered as exc:
        if as_json:
            dump({**exc.facts(), "follow": follow})
        click.echo(one_line(unanswered(exc)), err=True)
        sys.exit(EXIT_NOT_ANSWERED)
    except BrokerUnreachable as exc:
        if as_json:
            facts = exc.facts()
            dump({**facts, **{k: v for k, v in (ids or {}).items() if facts.get(k) is None}})
        raise click.ClickException(one_line(str(exc))) from None


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    try:
        return loop.run(coro)
    except CommandRejected as exc:
        click.echo(f"refused: {one_line(exc.reason)}", err=True)
        sys.exit(EXIT_REFUSED)
    except NotAnswered as exc:
        click.echo(one_line(str(exc)), err=True)
        sys.exit(EXIT_NOT_ANSWERED)
    except SagaError as exc:
        raise click.ClickException(str(exc)) from None
    except ValidationError as exc:
        raise click.ClickException(describe(exc)) from None
    except TimeoutError:
        raise click.ClickException("no answer in time: is the stack running?") from None
    except asyncpg.InvalidCatalogNameError as exc:
        raise click.ClickException(
            f"{exc} ({_where('database_url')}): run `saga migrate`, which creates it"
        ) from None
    except asyncpg.UndefinedTableError as exc:  # a database no `saga migrate` has been run on
        raise click.ClickException(
            f"{exc} ({_where('database_url')}): run `saga migrate` to create the tables"
        ) from None
    except AMQPConnectionError as exc:
        raise click.ClickException(f"cannot reach RabbitMQ ({_where('amqp_url')}): {exc}") from None
    except OSError as exc:  # asyncpg's connection errors are the OS's
        raise click.ClickException(
            f"cannot reach Postgres ({_where('database_url')}): {exc}"
        ) from None
    except (asyncpg.PostgresError, asyncpg.InterfaceError, AMQPError) as exc:
        raise click.ClickException(f"{type(exc).__name__}: {exc}") from None


def _where(setting: str) -> str:
    """``SAGA_X=url`` (password masked) for the settings of the command running."""
    ctx = click.get_current_context(silent=True)
    settings = ctx.meta.get(_SETTINGS) if ctx is not None else None
    url = getattr(settings, setting, "") if settings is not None else ""
    return f"SAGA_{setting.upper()}={masked(url)}"


def read_settings_later(ctx: click.Context, overrides: dict[str, Any]) -> None:
    """Keep the group's flags for ``settings_of``: a command's ``--help``, and a command that
    needs no settings (``saga tls``, ``saga new``), work whatever the environment holds."""
    ctx.meta[_OVERRIDES] = overrides


def settings_of(ctx: click.Context) -> Settings:
    """The settings (read at the first call), or a one-line error naming the variable."""
    found = ctx.meta.get(_SETTINGS)
    if isinstance(found, Settings):
        return found
    try:
        settings = Settings.from_env(**ctx.meta.get(_OVERRIDES, {}))
    except SagaError as exc:
        raise click.ClickException(str(exc)) from None
    ctx.meta[_SETTINGS] = settings
    return settings


async def with_store(
    settings: Settings, work: Callable[[Store], Awaitable[T]], role: str = "reader"
) -> T:
    """Postgres for the CLI: read-only (``reader``), or ``operator`` for fault injection; the
    CLI's other actions go through the broker as commands."""
    pool = await asyncpg.create_pool(database_url_for(settings, role), min_size=1, max_size=2)
    try:
        return await work(Store(pool))
    finally:
        await pool.close()


async def with_pool(settings: Settings, work: Callable[[asyncpg.Pool], Awaitable[T]]) -> T:
    return await with_store(settings, lambda store: work(store.pool), role="operator")


def cli_bus(settings: Settings) -> Bus:
    """The broker connection the CLI acts through: as ``SAGA_ACT_AS`` (a person's account, or by
    default the operations user) when the set-up's secrets are there, else as ``SAGA_AMQP_URL``
    says. Whoever it is, the coordinator records that user, verified by the broker."""
    if settings.identity == "shared":
        return Bus(settings)
    directory = Directory.from_settings(settings)
    if settings.secrets_dir:
        bus = Bus(settings, user=settings.act_as or directory.user("ops"))
    else:
        bus = Bus(settings)
    if directory.command_role(bus.user) is None:
        # The coordinator would dead-letter every command as forged, and nobody would answer.
        raise click.ClickException(
            f"the CLI connects to RabbitMQ as {bus.user!r}, which may send no command here "
            "(SAGA_IDENTITY=roles): set SAGA_SECRETS_DIR to the set-up's secrets (and "
            "SAGA_ACT_AS to act as a person, who must be in SAGA_PEOPLE), or give SAGA_AMQP_URL "
            "your own account"
        )
    return bus


def not_blank(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A click callback: a reason or note that must say something."""
    if value is not None and not value.strip():
        raise click.BadParameter("must not be blank")
    return value
