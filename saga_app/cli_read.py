"""The CLI's reads: ``saga show``, ``saga list``, ``saga rejections`` (read-only, as the
reader role)."""

from __future__ import annotations

from typing import Any, get_args

import click

from saga_app.cli_support import (
    run_async,
    settings_of,
    with_store,
)
from saga_app.output import dump, table
from saga_coordinator.incident import incident, render_markdown
from saga_coordinator.register import SagaState, SagaStatus
from saga_coordinator.report import render_register
from saga_coordinator.store import Store
from saga_shared.model.text import clean


@click.command()
@click.argument("saga_id", required=False)
@click.option("--order", "order_id", help="Show every saga of this order")
@click.option("--history", is_flag=True, help="Also list every message handled")
@click.option(
    "--format", "fmt", type=click.Choice(["table", "json", "markdown"]), default="table",
    help="markdown: the incident report, to attach to a ticket",
)  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Same as --format json")
@click.pass_context
def show(ctx: click.Context, saga_id: str | None, order_id: str | None, history: bool,
         fmt: str, as_json: bool) -> None:  # fmt: skip
    """The register of a saga (or of every saga of an order), its incident report, and whether
    its order is blocked."""
    if saga_id is None and order_id is None:
        raise click.UsageError("give a SAGA_ID, or --order ORDER_ID for an order's sagas")
    if saga_id is not None and order_id is not None:
        raise click.UsageError("give a SAGA_ID or --order, not both")
    fmt = "json" if as_json else fmt

    async def work(store: Store) -> list[dict[str, Any]]:
        if order_id:
            states = await store.by_order(order_id)
        else:
            states = [s for s in [await store.get(saga_id or "")] if s]
        items = []
        for state in states:
            item = state.register()
            item["report"] = incident(state)
            item["order_blocked_by"] = await store.blocks(state.order_id)
            item["parked"] = len(await store.parked(state.order_id))
            if history:
                item["history"] = await store.history(state.saga_id)
            items.append(item)
        return items

    found = run_async(with_store(settings_of(ctx), work))
    if not found and order_id:
        held = run_async(with_store(settings_of(ctx), lambda s: _order_held(s, order_id)))
        if held is not None:
            dump(held) if fmt == "json" else click.echo(_render_held(held))
            return
    if not found:
        raise click.ClickException(
            f"no saga {saga_id}" if saga_id else f"no saga for order {order_id}"
        )
    if fmt == "json":
        dump(found[0] if saga_id else found)
        return
    for item in found:
        if fmt == "markdown":
            click.echo(render_markdown(_state_of(item)))
        else:
            _echo_item(item, history)


async def _order_held(store: Store, order_id: str) -> dict[str, Any] | None:
    """An order without a saga that is still held: blocked by a dead letter, or with
    commands parked behind one."""
    blocks, parked = await store.blocks(order_id), await store.parked(order_id)
    if not blocks and not parked:
        return None
    return {"order_id": order_id, "sagas": [], "order_blocked_by": blocks, "parked": parked}


def _render_held(held: dict[str, Any]) -> str:
    lines = [f"order {held['order_id']}: no saga yet, but the order is held"]
    for block in held["order_blocked_by"]:
        lines.append(f"  BLOCKED by {block['message_id']} ({block['state']}): {block['reason']}")
    for item in held["parked"]:
        lines.append(f"  parked: {item['message_type']} {item['message_id']} ({item['reason']})")
    lines.append(f"see `saga dlq list --order {held['order_id']}`")
    return clean("\n".join(lines), 100_000)


def _state_of(item: dict[str, Any]) -> SagaState:
    extras = ("order_blocked_by", "parked", "history", "report")
    return SagaState.model_validate({k: v for k, v in item.items() if k not in extras})


def _echo_item(item: dict[str, Any], history: bool) -> None:
    click.echo(render_register(_state_of(item)))
    for block in item["order_blocked_by"]:
        click.echo(
            f"order BLOCKED by {block['message_id']} ({block['state']}): {block['reason']};"
            f" {item['parked']} message(s) parked behind it"
            f" (see `saga dlq list --order {item['order_id']}`)"
        )
    if history:
        rows = [(r["seq"], r["handled_at"], r["message_type"], r["note"]) for r in item["history"]]
        table(("seq", "handled at", "message", "note"), rows)
    click.echo()


STATUSES = (*get_args(SagaStatus), "blocked")


@click.command("list")
@click.option("--status", type=click.Choice(STATUSES), help="blocked: orders held by dead letters")
@click.option("--order", "order_id")
@click.option("--limit", default=100, type=click.IntRange(1, 10_000))
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def list_(ctx: click.Context, status: str | None, order_id: str | None, limit: int,
          as_json: bool) -> None:  # fmt: skip
    """Sagas, newest first (waiting ones say what they wait for); or blocked orders."""
    settings = settings_of(ctx)
    if status == "blocked":
        rows = run_async(with_store(settings, lambda s: s.blocked_orders(limit)))
        keys: tuple[str, ...] = (
            "order_id",
            "message_id",
            "state",
            "parked",
            "created_at",
            "reason",
        )
    else:
        rows = run_async(with_store(settings, lambda s: s.list_sagas(status, order_id, limit)))
        keys = ("saga_id", "order_id", "saga", "status", "waiting_for", "created_at", "updated_at")
    if as_json:
        dump(rows)
        return
    table(keys, [[r[k] for k in keys] for r in rows])


@click.command()
@click.option("--order", "order_id")
@click.option("--limit", default=100, type=click.IntRange(1, 10_000))
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def rejections(ctx: click.Context, order_id: str | None, limit: int, as_json: bool) -> None:
    """Commands the gateway refused, newest first, with the rule and the reason."""
    rows = run_async(with_store(settings_of(ctx), lambda s: s.rejections(order_id, limit)))
    if as_json:
        dump(rows)
        return
    keys = ("rejected_at", "sender", "order_id", "command_type", "rule", "reason")
    table(keys, [[*(r[k] for k in keys[:-1]), clean(str(r["reason"]), 200)] for r in rows])
