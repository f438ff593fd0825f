"""``saga faults`` and ``saga effects``: rehearsing failures in the simulated systems."""

from __future__ import annotations

import click

from saga_app.cli_support import dump, run_async, settings_of, with_pool
from saga_coordinator.report import table
from services import faults as fault_store
from services.effects import effects_for_order, render_effects


@click.group()
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
        fault_store.check_action(action)
    except ValueError as exc:
        raise click.BadParameter(
            str(exc), param_hint="--mode" if "mode" in str(exc) else "ACTION"
        ) from None
    run_async(
        with_pool(settings_of(ctx), lambda p: fault_store.add_fault(p, action, order_id, mode))
    )
    click.echo(f"fault {mode} on {action} for order {order_id}")


@faults.command("list")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def faults_list(ctx: click.Context, as_json: bool) -> None:
    rows = run_async(with_pool(settings_of(ctx), fault_store.list_faults))
    if as_json:
        dump(rows)
    else:
        keys = ("action", "order_id", "mode", "remaining", "created_at")
        click.echo(table(keys, [[r.get(k) for k in keys] for r in rows]))


@faults.command("clear")
@click.option("--order", "order_id", help="Only this order's faults")
@click.pass_context
def faults_clear(ctx: click.Context, order_id: str | None) -> None:
    count = run_async(with_pool(settings_of(ctx), lambda p: fault_store.clear_faults(p, order_id)))
    click.echo(f"cleared {count} fault(s)")


@click.command()
@click.option("--order", "order_id", required=True)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def effects(ctx: click.Context, order_id: str, as_json: bool) -> None:
    """What the simulated systems hold for an order, and how often each effect was applied."""
    found = run_async(with_pool(settings_of(ctx), lambda p: effects_for_order(p, order_id)))
    dump(found) if as_json else click.echo(render_effects(found))
