"""``saga``: a thin shell over the objects the services use. Every option is also an environment
variable (shown in ``--help``); ``--json`` wherever a script may read the output."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import asyncpg
import click

from saga_coordinator.app import COMPONENTS, Stack
from saga_coordinator.demo import run_demo
from saga_coordinator.register import SagaState
from saga_coordinator.report import render_register, table
from saga_coordinator.store import Store
from services import faults as fault_store
from services.effects import effects_for_order, render_effects
from shared.bus import Bus
from shared.catalog import load_catalog
from shared.client import CommandRejected, SagaClient
from shared.config import Settings
from shared.errors import SagaError
from shared.messages import Plan, PlanStep
from shared.migrations import migrate as run_migrations

T = TypeVar("T")
EXIT_REFUSED = 2
EXIT_TIMEOUT = 3


def _run(coro: Coroutine[Any, Any, T]) -> T:
    try:
        return asyncio.run(coro)
    except CommandRejected as exc:
        click.echo(f"refused: {exc.reason}", err=True)
        sys.exit(EXIT_REFUSED)
    except SagaError as exc:
        raise click.ClickException(str(exc)) from None
    except (OSError, asyncpg.PostgresError) as exc:
        raise click.ClickException(f"{type(exc).__name__}: {exc}") from None


def _settings(ctx: click.Context) -> Settings:
    settings: Settings = ctx.obj
    return settings


def _dump(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, default=str))


async def _with_store(settings: Settings, work: Callable[[Store], Awaitable[T]]) -> T:
    pool = await asyncpg.create_pool(settings.database_url, min_size=1, max_size=2)
    try:
        return await work(Store(pool))
    finally:
        await pool.close()


@click.group(context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.option("--amqp-url", envvar="SAGA_AMQP_URL", help="RabbitMQ URL [env SAGA_AMQP_URL]")
@click.option("--database-url", envvar="SAGA_DATABASE_URL", help="Postgres [SAGA_DATABASE_URL]")
@click.option("--namespace", envvar="SAGA_NAMESPACE", help="Queue prefix [SAGA_NAMESPACE]")
@click.option("--partitions", envvar="SAGA_PARTITIONS", type=int, help="[SAGA_PARTITIONS]")
@click.option("--catalog", envvar="SAGA_CATALOG_PATH", help="Catalog TOML [SAGA_CATALOG_PATH]")
@click.option("--log-level", envvar="SAGA_LOG_LEVEL", default="INFO", help="[SAGA_LOG_LEVEL]")
@click.pass_context
def main(ctx: click.Context, /, **options: Any) -> None:
    """Reversible sagas for AI agents' writes, over RabbitMQ and Postgres."""
    logging.basicConfig(
        level=str(options.pop("log_level")).upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    options["catalog_path"] = options.pop("catalog")
    try:
        ctx.obj = Settings.from_env(**options)
    except SagaError as exc:
        raise click.ClickException(str(exc)) from None


@main.command()
@click.argument("components", nargs=-1, type=click.Choice(["all", *COMPONENTS]))
@click.option(
    "--demo", is_flag=True, envvar="SAGA_DEMO", help="Also run the demo agent [SAGA_DEMO]"
)
@click.pass_context
def run(ctx: click.Context, components: tuple[str, ...], demo: bool) -> None:
    """Run processes in the foreground until SIGINT/SIGTERM (default: all)."""
    settings = _settings(ctx)
    _run(_serve(settings, components or ("all",), demo))


async def _serve(settings: Settings, components: tuple[str, ...], demo: bool) -> None:
    await run_migrations(settings.database_url)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with Stack(settings, components) as stack:
        click.echo(f"running {', '.join(stack.components)}; Ctrl-C to stop", err=True)
        waiters = [asyncio.create_task(stop.wait()), asyncio.create_task(stack.wait())]
        if demo:
            await run_demo(settings, click.echo)
            click.echo("\ndemo done; the stack keeps running (Ctrl-C to stop)", err=True)
        done, pending = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        for task in done:
            task.result()
    click.echo("stopped", err=True)


@main.command()
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def migrate(ctx: click.Context, as_json: bool) -> None:
    """Create the database if needed and apply pending migrations."""
    applied = _run(run_migrations(_settings(ctx).database_url))
    _dump({"applied": applied}) if as_json else click.echo(f"applied: {applied or 'nothing new'}")


@main.command()
@click.pass_context
def declare(ctx: click.Context) -> None:
    """Declare every exchange and queue (idempotent); also done by `saga run`."""

    async def work() -> None:
        async with Bus(_settings(ctx)) as bus:
            await bus.declare()

    _run(work())
    click.echo("topology declared")


@main.command()
@click.pass_context
def check(ctx: click.Context) -> None:
    """Load the catalog and run every gateway check; exit non-zero naming the broken rule."""
    settings = _settings(ctx)
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
@click.option("--wait", "wait_s", type=float, help="Wait this many seconds for the outcome")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def start(ctx: click.Context, saga: str | None, order_id: str, params: tuple[str, ...],
          steps: tuple[str, ...], priority: tuple[str, ...], saga_id: str | None,
          wait_s: float | None, as_json: bool) -> None:  # fmt: skip
    """Publish a start command exactly as an agent would (SAGA, or --step for an ad-hoc plan)."""
    if (saga is None) == (not steps):
        raise click.UsageError("give a saga name or --step actions, not both")
    plan = (
        Plan(steps=tuple(PlanStep(action=a) for a in steps), compensation_priority=priority)
        if steps
        else None
    )
    settings = _settings(ctx)

    async def work() -> tuple[str, SagaState | None]:
        async with Bus(settings) as bus, SagaClient(bus) as client:
            sid = await client.start(
                saga, order_id=order_id, params=_parse_params(params), plan=plan, saga_id=saga_id
            )
            if wait_s is None:
                return sid, None
            try:
                await client.wait(sid, seconds=wait_s)
            except TimeoutError:
                click.echo(f"saga {sid}: no outcome within {wait_s}s", err=True)
                sys.exit(EXIT_TIMEOUT)
        return sid, await _with_store(settings, lambda s: s.get(sid))

    sid, state = _run(work())
    _print_outcome(sid, state, as_json)


def _print_outcome(saga_id: str, state: SagaState | None, as_json: bool) -> None:
    if as_json:
        _dump({"saga_id": saga_id} if state is None else state.register())
    elif state is None:
        click.echo(f"accepted: saga {saga_id}")
    else:
        click.echo(render_register(state))


@main.command()
@click.argument("saga_id", required=False)
@click.option("--order", "order_id", help="Show every saga of this order")
@click.option("--history", is_flag=True, help="Also list every message handled")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def show(ctx: click.Context, saga_id: str | None, order_id: str | None, history: bool,
         as_json: bool) -> None:  # fmt: skip
    """The register of a saga (or of every saga of an order)."""
    if (saga_id is None) == (order_id is None):
        raise click.UsageError("give a SAGA_ID or --order, not both")

    async def work(store: Store) -> list[tuple[SagaState, list[dict[str, Any]]]]:
        states = (
            await store.by_order(order_id)
            if order_id
            else [s for s in [await store.get(saga_id or "")] if s]
        )
        return [(s, await store.history(s.saga_id) if history else []) for s in states]

    found = _run(_with_store(_settings(ctx), work))
    if not found:
        raise click.ClickException(
            f"no saga {saga_id}" if saga_id else f"no saga for order {order_id}"
        )
    if as_json:
        items = [{**s.register(), **({"history": h} if history else {})} for s, h in found]
        _dump(items[0] if saga_id else items)
        return
    for state, log in found:
        click.echo(render_register(state))
        if history:
            click.echo(
                table(
                    ("handled at", "message", "note"),
                    [(r["handled_at"], r["message_type"], r["note"]) for r in log],
                )
            )
        click.echo()


@main.command("list")
@click.option(
    "--status",
    type=click.Choice(["running", "compensating", "completed", "compensated", "needs_human"]),
)
@click.option("--order", "order_id")
@click.option("--limit", default=100, type=click.IntRange(1, 10_000))
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def list_(
    ctx: click.Context, status: str | None, order_id: str | None, limit: int, as_json: bool
) -> None:
    """Sagas, newest first."""
    rows = _run(_with_store(_settings(ctx), lambda s: s.list_sagas(status, order_id, limit)))
    if as_json:
        _dump(rows)
        return
    keys = ("saga_id", "order_id", "saga", "status", "created_at", "updated_at")
    click.echo(table(keys, [[r[k] for k in keys] for r in rows]))


async def _lookup_order(settings: Settings, saga_id: str) -> str:
    order = await _with_store(settings, lambda s: s.order_of(saga_id))
    if order is None:
        raise click.ClickException(f"no saga {saga_id}")
    return order


@main.command()
@click.argument("saga_id")
@click.option("--note", default="", help="Why, for the register")
@click.option("--wait", "wait_s", type=float, help="Wait this many seconds for the outcome")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def resume(
    ctx: click.Context, saga_id: str, note: str, wait_s: float | None, as_json: bool
) -> None:
    """Continue compensating a saga in needs_human, skipping what is already undone."""
    settings = _settings(ctx)

    async def work() -> SagaState | None:
        order = await _lookup_order(settings, saga_id)
        async with Bus(settings) as bus, SagaClient(bus) as client:
            await client.resume(saga_id, order_id=order, note=note)
            if wait_s is None:
                return None
            try:
                await client.wait(saga_id, seconds=wait_s)
            except TimeoutError:
                click.echo(f"saga {saga_id}: no outcome within {wait_s}s", err=True)
                sys.exit(EXIT_TIMEOUT)
        return await _with_store(settings, lambda s: s.get(saga_id))

    _print_outcome(saga_id, _run(work()), as_json)


@main.command()
@click.argument("saga_id")
@click.option("--reason", required=True, help="Why, for the register")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def abort(ctx: click.Context, saga_id: str, reason: str, as_json: bool) -> None:
    """Stop a running saga and compensate everything that may have landed."""
    settings = _settings(ctx)

    async def work() -> None:
        order = await _lookup_order(settings, saga_id)
        async with Bus(settings) as bus, SagaClient(bus) as client:
            await client.abort(saga_id, order_id=order, reason=reason)

    _run(work())
    _dump({"saga_id": saga_id, "aborted": True}) if as_json else click.echo(f"aborting {saga_id}")


@main.group()
def faults() -> None:
    """Fault injection in the simulated systems, per action and order."""


@faults.command("add")
@click.argument("action")
@click.option("--order", "order_id", required=True)
@click.option("--mode", required=True, help="permanent | transient:N")
@click.pass_context
def faults_add(ctx: click.Context, action: str, order_id: str, mode: str) -> None:
    try:
        fault_store.parse_mode(mode)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--mode") from None
    _run(_with_pool(_settings(ctx), lambda p: fault_store.add_fault(p, action, order_id, mode)))
    click.echo(f"fault {mode} on {action} for order {order_id}")


@faults.command("list")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def faults_list(ctx: click.Context, as_json: bool) -> None:
    rows = _run(_with_pool(_settings(ctx), fault_store.list_faults))
    if as_json:
        _dump(rows)
    else:
        keys = ("action", "order_id", "mode", "remaining", "created_at")
        click.echo(table(keys, [[r.get(k) for k in keys] for r in rows]))


@faults.command("clear")
@click.option("--order", "order_id", help="Only this order's faults")
@click.pass_context
def faults_clear(ctx: click.Context, order_id: str | None) -> None:
    count = _run(_with_pool(_settings(ctx), lambda p: fault_store.clear_faults(p, order_id)))
    click.echo(f"cleared {count} fault(s)")


async def _with_pool(settings: Settings, work: Callable[[asyncpg.Pool], Awaitable[T]]) -> T:
    return await _with_store(settings, lambda store: work(store.pool))


@main.command()
@click.option("--order", "order_id", required=True)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def effects(ctx: click.Context, order_id: str, as_json: bool) -> None:
    """What the simulated systems hold for an order, and how often each effect was applied."""
    found = _run(_with_pool(_settings(ctx), lambda p: effects_for_order(p, order_id)))
    _dump(found) if as_json else click.echo(render_effects(found))


@main.command()
@click.option("--order", "order_id")
@click.option("--limit", default=100, type=click.IntRange(1, 10_000))
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def rejections(ctx: click.Context, order_id: str | None, limit: int, as_json: bool) -> None:
    """Commands the gateway refused, newest first, with the rule and the reason."""
    rows = _run(_with_store(_settings(ctx), lambda s: s.rejections(order_id, limit)))
    if as_json:
        _dump(rows)
        return
    keys = ("rejected_at", "order_id", "command_type", "rule", "reason")
    click.echo(table(keys, [[r[k] for k in keys] for r in rows]))


@main.command()
@click.option("--wait", "wait_s", default=60.0, type=float)
@click.pass_context
def demo(ctx: click.Context, wait_s: float) -> None:
    """Act as an agent against a running stack: three sagas, each register printed."""
    _run(run_demo(_settings(ctx), click.echo, wait_s))


if __name__ == "__main__":  # pragma: no cover
    main()
