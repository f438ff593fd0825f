"""``saga faults`` and ``saga effects``: rehearsing failures, and what the systems hold."""

from __future__ import annotations

import click

from saga_app.cli_support import run_async, settings_of, with_pool
from saga_app.output import dump, table, warning
from saga_services import faults as fault_store
from saga_services.effects import applied_twice, effect_tables, effects_for_order
from saga_services.registry import all_actions
from saga_shared.config import Settings
from saga_shared.errors import SagaError
from saga_shared.model.gateway import load_catalog
from saga_shared.model.text import clean


@click.group()
def faults() -> None:
    """Fault injection per action and order, for rehearsing failures."""


@faults.command("add")
@click.argument("action")
@click.option("--order", "order_id", required=True)
@click.option("--mode", required=True, help="permanent | transient:N | hang | hang:N")
@click.pass_context
def faults_add(ctx: click.Context, action: str, order_id: str, mode: str) -> None:
    """Make ACTION fail for one order: permanent (refused, nothing landed), transient:N (the
    next N calls fail, then it works), hang or hang:N (no answer: the step's deadline fires).
    The simulated systems always apply faults; the adapter of a service of your own does when
    it runs with SAGA_INJECT_FAULTS=true. `saga faults clear --order ID` lifts them."""
    try:
        fault_store.parse_mode(mode)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--mode") from None
    settings = settings_of(ctx)
    own = _own_actions(settings)
    try:
        fault_store.check_action(action, own)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="ACTION") from None
    run_async(with_pool(settings, lambda p: fault_store.add_fault(p, action, order_id, mode, own)))
    click.echo(clean(f"fault {mode} on {action} for order {order_id}"))
    if action in own:  # said plainly: nothing applies it otherwise
        click.echo(f"{action.split('.')[0]} is your own service: its adapter applies this "
                   "fault only if it runs with SAGA_INJECT_FAULTS=true")  # fmt: skip


@faults.command("list")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def faults_list(ctx: click.Context, as_json: bool) -> None:
    """The faults in place: action, order, mode and how many calls it still fails."""
    rows = run_async(with_pool(settings_of(ctx), fault_store.list_faults))
    if as_json:
        dump(rows)
    else:
        keys = ("action", "order_id", "mode", "remaining", "created_at")
        table(keys, [[r.get(k) for k in keys] for r in rows])


@faults.command("clear")
@click.option("--order", "order_id", help="Only this order's faults")
@click.pass_context
def faults_clear(ctx: click.Context, order_id: str | None) -> None:
    """Lift the faults of one order (--order), or all of them."""
    count = run_async(with_pool(settings_of(ctx), lambda p: fault_store.clear_faults(p, order_id)))
    click.echo(f"cleared {count} fault(s)")


@click.command()
@click.option("--order", "order_id", required=True)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def effects(ctx: click.Context, order_id: str, as_json: bool) -> None:
    """What the simulated systems hold for an order, how often each effect was applied, and
    every service's calls for it (the key record: services of one's own too)."""
    found = run_async(
        with_pool(settings_of(ctx), lambda p: effects_for_order(p, order_id, calls=True))
    )
    if as_json:
        dump(found)
        return
    for i, (title, headers, rows) in enumerate(effect_tables(found)):
        if i:
            click.echo()
        table(headers, rows, title=title)
    twice = applied_twice(found)
    if twice:
        click.echo()
        warning(f"WARNING: applied more than once for key(s): {', '.join(twice)}")


def _own_actions(settings: Settings) -> set[str]:
    """The actions and compensations SAGA_CATALOG_PATH declares beyond the simulated systems'
    (those of one's own services)."""
    try:
        catalog = load_catalog(settings.catalog_file)
    except (SagaError, OSError):
        return set()  # a catalog that cannot load says so where it is used, not here
    return {*catalog.actions, *catalog.compensations} - set(all_actions())
