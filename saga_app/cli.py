"""``saga``: a thin shell over the objects the services use. Every option is also an environment
variable (shown in ``--help``); ``--json`` wherever a script may read the output."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
import sys
import uuid
from typing import Any

import aiormq
import asyncpg
import click
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_exponential

from saga_app.cli_console import console_user
from saga_app.cli_contract import schema, watch
from saga_app.cli_decide import (
    abort,
    approve,
    print_outcome,
    reject,
    resolve,
    resume,
    settle,
)
from saga_app.cli_dlq import dlq
from saga_app.cli_mcp import mcp
from saga_app.cli_new import new
from saga_app.cli_ops import effects, faults
from saga_app.cli_read import list_, rejections, show
from saga_app.cli_setup import setup, tls
from saga_app.cli_support import (
    ANSWER_WITHIN_S,
    EXIT_STOPPED,
    EXIT_TIMEOUT,
    Deadline,
    SagaGroup,
    Seconds,
    cli_bus,
    client_outcomes,
    read_settings_later,
    run_async,
    settings_of,
    with_store,
)
from saga_app.console.settings import ConsoleSettings
from saga_app.demo import run_demo
from saga_app.entry import version
from saga_app.output import dump
from saga_app.stack import Stack
from saga_coordinator.register import SagaState
from saga_shared.client import NotAnswered, SagaClient
from saga_shared.config import Settings
from saga_shared.errors import SagaError
from saga_shared.model.gateway import load_catalog
from saga_shared.model.ids import random_id
from saga_shared.model.messages import Plan, PlanStep
from saga_shared.observability import logs, metrics, tracing
from saga_shared.security.identity import Directory, database_url_for
from saga_shared.storage.migrations import migrate as run_migrations
from saga_shared.storage.migrations import pending
from saga_shared.transport.bus import Bus

log = logging.getLogger(__name__)


@click.group(
    cls=SagaGroup, context_settings={"help_option_names": ["-h", "--help"], "show_default": True}
)
@click.version_option(version(), prog_name="saga")
@click.option("--amqp-url", envvar="SAGA_AMQP_URL", help="RabbitMQ URL [env SAGA_AMQP_URL]")
@click.option("--database-url", envvar="SAGA_DATABASE_URL", help="Postgres [SAGA_DATABASE_URL]")
@click.option("--namespace", envvar="SAGA_NAMESPACE", help="Queue prefix [SAGA_NAMESPACE]")
@click.option("--partitions", envvar="SAGA_PARTITIONS", type=int, help="[SAGA_PARTITIONS]")
@click.option("--catalog", envvar="SAGA_CATALOG_PATH", help="Catalog TOML [SAGA_CATALOG_PATH]")
@click.option(
    "--log-level", envvar="SAGA_LOG_LEVEL", default="INFO", help="[SAGA_LOG_LEVEL]",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"], case_sensitive=False),
)  # fmt: skip
@click.option(
    "--log-format", envvar="SAGA_LOG_FORMAT", default="text",
    type=click.Choice(["text", "json"]), help="json: one object per line [SAGA_LOG_FORMAT]",
)  # fmt: skip
@click.option(
    "--as", "act_as", envvar="SAGA_ACT_AS",
    help="With SAGA_SECRETS_DIR: the broker account to act as (default: <prefix>ops) [SAGA_ACT_AS]",
)  # fmt: skip
@click.pass_context
def main(ctx: click.Context, /, **options: Any) -> None:
    """Reversible sagas for AI agents' writes, over RabbitMQ and Postgres."""
    logs.configure(str(options.pop("log_level")), str(options.pop("log_format")))
    if ctx.invoked_subcommand not in ("run", "mcp"):
        # A one-shot command that cannot connect says so once and exits; the client
        # library's own "reconnecting in 5 seconds" lines would only mislead.
        for noisy in ("aiormq", "aio_pika"):
            logging.getLogger(noisy).setLevel(logging.CRITICAL)
    options["catalog_path"] = options.pop("catalog")
    read_settings_later(ctx, options)


@main.command()
@click.argument("components", nargs=-1, metavar="[COMPONENT]...")
@click.option(
    "--demo", is_flag=True, envvar="SAGA_DEMO", help="Also run the demo agent [SAGA_DEMO]"
)
@click.pass_context
def run(ctx: click.Context, components: tuple[str, ...], demo: bool) -> None:
    """Run components in the foreground until SIGINT/SIGTERM (default: all).

    A component is one of: all, coordinator, inventory, erp, payments, email, payments-http
    (payments through the HTTP API), payments-api (that API), console (the operators' web
    console; with all, it runs when SAGA_CONSOLE_USERS names an accounts file); or a service
    of your own, as package.module:attribute (a saga_services.sdk.Service)."""
    settings = settings_of(ctx)
    run_async(_serve(settings, components or ("all",), demo))


async def _serve(settings: Settings, components: tuple[str, ...], demo: bool) -> None:
    # The components, the catalog and the console's accounts are checked before anything is
    # served: a mistyped component is its one error line, not the second after a metrics one.
    first = Stack(settings, components, console=ConsoleSettings.from_env())
    beating = None
    if settings.metrics_bind != "off" and metrics.serve(settings.metrics_bind):
        beating = asyncio.create_task(metrics.heartbeat())
    try:
        await _run_stack(settings, components, demo, first)
    finally:
        if beating is not None:
            beating.cancel()


async def _run_stack(
    settings: Settings, components: tuple[str, ...], demo: bool, first: Stack
) -> None:
    tracing.configure("saga-" + "-".join(components or ("all",)))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    with logs.waiting_for_the_broker():
        stack = await _start_when_ready(settings, components, stop, first)
    if stack is None:
        return
    try:
        log.info("running %s; Ctrl-C to stop", ", ".join(stack.components))
        waiters = [asyncio.create_task(stop.wait()), asyncio.create_task(stack.wait())]
        if demo:
            await run_demo(settings, click.echo)
            log.info("demo done; the stack keeps running (Ctrl-C to stop)")
        done, pending = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        for task in done:
            task.result()
    finally:
        await stack.stop()
    log.info("stopped")


async def _start_when_ready(
    settings: Settings, components: tuple[str, ...], stop: asyncio.Event, first: Stack
) -> Stack | None:
    """A process started while RabbitMQ or Postgres is down (or still recovering) waits for
    them instead of exiting; a restart loop of its supervisor is then never needed."""

    async def until_stopped(seconds: float) -> None:  # a stop ends the wait at once
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), seconds)

    waiting = AsyncRetrying(
        retry=retry_if_exception_type(_NOT_READY),
        wait=wait_exponential(multiplier=0.5, max=5.0),
        sleep=until_stopped,
        before_sleep=_say_waiting,
    )
    fresh: Stack | None = first
    # The first stack said what it runs (and why not the console): the next tries stay quiet.
    console = ConsoleSettings.from_env() if first.console_runner is not None else None
    async for attempt in waiting:
        with attempt:
            if stop.is_set():
                return None
            stack = fresh or Stack(settings, components, console=console)
            fresh = None  # a stack that failed to start is not started again: a new one is
            try:
                await _schema_ready(settings)
                await stack.start()
            except _NOT_READY:
                await stack.stop()
                raise
            return stack
    return None


def _say_waiting(state: RetryCallState) -> None:
    exc = state.outcome.exception() if state.outcome is not None else None
    log.warning("waiting for the broker and the database: %r", exc)


_NOT_READY = (
    OSError, ConnectionError, asyncpg.PostgresError, aiormq.exceptions.AMQPError,
    asyncpg.InterfaceError,
)  # fmt: skip


class SchemaBehind(ConnectionError):
    """The database lacks migrations this code needs: wait for `saga migrate` (or set-up)."""


async def _schema_ready(settings: Settings) -> None:
    """In shared mode a process migrates the database itself; in roles mode it cannot (its role
    owns no tables) and waits until the set-up has migrated it."""
    if settings.identity == "shared":
        await run_migrations(settings.database_url)
        return
    missing = await pending(database_url_for(settings, "coordinator"))
    if missing:
        raise SchemaBehind(f"the database lacks {', '.join(missing)}: run `saga migrate`")


@main.command()
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def migrate(ctx: click.Context, as_json: bool) -> None:
    """Create the database if needed and apply pending migrations."""
    applied = run_async(run_migrations(settings_of(ctx).database_url))
    dump({"applied": applied}) if as_json else click.echo(f"applied: {applied or 'nothing new'}")


@main.command()
@click.pass_context
def declare(ctx: click.Context) -> None:
    """Declare every exchange and queue (idempotent); also done by `saga run`."""

    settings = settings_of(ctx)

    async def work() -> None:
        user = Directory.from_settings(settings).user("coordinator") if settings.secrets_dir \
            else None  # fmt: skip
        async with Bus(settings, user=user) as bus:
            await bus.declare()

    run_async(work())
    click.echo("topology declared")


@main.command()
@click.pass_context
def check(ctx: click.Context) -> None:
    """Load the catalog and run every gateway check; exit non-zero naming the broken rule."""
    settings = settings_of(ctx)
    try:
        catalog = load_catalog(settings.catalog_file)
    except SagaError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(
        f"{settings.catalog_file}: {len(catalog.actions)} actions, sagas {list(catalog.sagas)}"
    )


def _parse_params(pairs: tuple[str, ...]) -> dict[str, str]:
    params: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r}: expected key=value", param_hint="--param")
        params[key] = value
    return params


@main.command()
@click.argument("saga", required=False)
@click.option("--order", "order_id", required=True, help="Order ID (orders run one saga at a time)")
@click.option("--param", "params", multiple=True, help="key=value, repeatable")
@click.option("--step", "steps", multiple=True, help="Ad-hoc plan: an action, repeatable")
@click.option("--priority", multiple=True, help="Ad-hoc plan: compensate this action first")
@click.option("--saga-id", help="Choose the saga ID (default: a new UUID)")
@click.option(
    "--message-id", envvar="SAGA_MESSAGE_ID",
    help="Choose the command's message ID (default: a new one). The same --saga-id and "
    "--message-id again are the same start, applied once: set it for one command only "
    "[SAGA_MESSAGE_ID]",
)  # fmt: skip
@click.option(
    "--wait", "wait_s", type=Seconds(),
    help="Wait for the outcome: the whole command (connecting, sending, the answer, the "
    f"outcome) takes about this many seconds at most [without it: {ANSWER_WITHIN_S:g} s, to "
    "the answer]",
)  # fmt: skip
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def start(ctx: click.Context, saga: str | None, order_id: str, params: tuple[str, ...],
          steps: tuple[str, ...], priority: tuple[str, ...], saga_id: str | None,
          message_id: str | None, wait_s: float | None, as_json: bool) -> None:  # fmt: skip
    """Publish a start command exactly as an agent would (SAGA, or --step for an ad-hoc plan).

    It prints the saga ID and the message ID it sent. Not answered in time (the coordinator is
    not running), it exits 5: the start is queued and runs when the stack is back; sending it
    again with the same --saga-id and --message-id is safe."""
    if saga is None and not steps:
        raise click.UsageError("give a saga name, or --step actions for an ad-hoc plan")
    if saga is not None and steps:
        raise click.UsageError("give a saga name or --step actions, not both")
    plan = (
        Plan(steps=tuple(PlanStep(action=a) for a in steps), compensation_priority=priority)
        if steps
        else None
    )
    settings = settings_of(ctx)
    deadline = Deadline(wait_s)
    # Chosen here, not by the client, so that whatever happens they can be printed.
    sid, mid = saga_id or str(uuid.uuid4()), message_id or random_id()
    sent = {"saga_id": sid, "message_id": mid}

    async def work() -> SagaState | None:
        bus = cli_bus(settings)
        unanswered = functools.partial(_start_not_answered, order_id, deadline.seconds)
        with client_outcomes(as_json, unanswered, follow=f"saga show {sid}", ids=sent):
            async with SagaClient(bus, answer_within_s=deadline.for_answer()) as client:
                await client.start(
                    saga, order_id=order_id, params=_parse_params(params), plan=plan,
                    saga_id=sid, message_id=mid, answer_within_s=deadline.for_answer(),
                )  # fmt: skip
                reply = client.last_reply
                parked = reply.reason if reply and reply.type == "command.parked" else None
                if not as_json:  # the ids first: whatever comes next, they are known
                    click.echo(
                        f"accepted: saga {sid} (message {mid})" if parked is None
                        else f"parked: saga {sid} (message {mid}) waits ({parked})"
                    )  # fmt: skip
                if wait_s is None:
                    if as_json and parked is not None:
                        dump({**sent, "parked": parked})
                        sys.exit(0)
                    return None
                try:
                    stop = await client.wait(sid, seconds=deadline.left(), stops=True)
                except TimeoutError:
                    click.echo(f"saga {sid}: no outcome within {wait_s}s", err=True)
                    sys.exit(EXIT_TIMEOUT)
        state = await with_store(settings, lambda s: s.get(sid))
        if stop.type == "saga.awaiting_approval":  # nothing more happens without a person
            _print_started(state, sent, as_json)
            click.echo(
                f"saga {sid} waits at a gate for a decision: saga approve|reject {sid}", err=True
            )
            sys.exit(EXIT_STOPPED)
        return state

    state = run_async(work())
    if as_json or state is not None:
        _print_started(state, sent, as_json)


def _print_started(state: SagaState | None, sent: dict[str, str], as_json: bool) -> None:
    if as_json:
        dump({**(state.register() if state is not None else {}), **sent})
    else:
        print_outcome(sent["saga_id"], state, as_json)


def _start_not_answered(order_id: str, seconds: float, exc: NotAnswered) -> str:
    """The paragraph for a start that was sent and not answered: it is not lost, and a new
    saga id would start it twice."""
    sid, mid = exc.saga_id or "", exc.message_id
    sent = f"saga {sid} (order {order_id}) was sent {_times(exc.sends)} as message {mid}"
    again = f"`saga start` again with the same --saga-id {sid} --message-id {mid}"
    if exc.queued:
        return (
            f"not answered within {seconds:g} s, but the start is queued: {sent} and "
            "RabbitMQ holds it. It will run when the stack (the coordinator) is back, unless "
            "the coordinator refuses it (then it says why). Follow it "
            f"with `saga show {sid}`, or run {again}, which is safe: it starts once."
        )
    return (
        f"not answered within {seconds:g} s, and RabbitMQ did not confirm the start: "
        f"{sent} and may be queued (then it will run when the stack is back) or lost. Run "
        f"{again}, which is safe: it starts once at most; follow it with `saga show {sid}`."
    )


def _times(count: int) -> str:
    return "once" if count == 1 else f"{count} times"


@main.command()
@click.option("--wait", "wait_s", default=60.0, type=Seconds())
@click.pass_context
def demo(ctx: click.Context, wait_s: float) -> None:
    """Act as an agent against a running stack: three sagas, each register printed."""
    run_async(run_demo(settings_of(ctx), click.echo, wait_s))


for command in (abort, approve, reject, resume, resolve, settle):
    main.add_command(command)
main.add_command(dlq)
for command in (show, list_, rejections):
    main.add_command(command)
main.add_command(schema)
main.add_command(watch)
main.add_command(faults)
main.add_command(effects)
main.add_command(setup)
main.add_command(tls)
main.add_command(mcp)
main.add_command(new)
main.add_command(console_user)

if __name__ == "__main__":  # pragma: no cover
    main()
