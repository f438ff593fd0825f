"""``saga dlq``: find, understand, replay or discard dead letters."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from typing import Any

import click

from saga_app.cli_support import (
    Deadline,
    cli_bus,
    client_outcomes,
    not_blank,
    run_async,
    settings_of,
    with_store,
)
from saga_app.moments import parse_moment
from saga_app.output import dump, table
from saga_coordinator.desk import DeadLetterDesk
from saga_coordinator.processor import Processor
from saga_coordinator.store import Store
from saga_shared.client import NotAnswered, SagaClient
from saga_shared.config import Settings
from saga_shared.model.gateway import load_catalog
from saga_shared.model.messages import DeskReply
from saga_shared.model.text import clean
from saga_shared.transport.topology import Topology


def parse_since(text: str | None) -> datetime | None:
    """``30m``, ``2h``, ``1d`` ago, or an ISO timestamp (UTC when no zone is given)."""
    if text is None:
        return None
    try:
        return parse_moment(text)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--since") from None


def _desk(settings: Settings, store: Store) -> DeadLetterDesk:
    processor = Processor(load_catalog(settings.catalog_file), Topology.from_settings(settings))
    return DeadLetterDesk(store, processor)


@click.group()
def dlq() -> None:
    """Dead letters: messages that could not be handled, and what waits behind them."""


@dlq.command("list")
@click.option("--order", "order_id")
@click.option("--reason", help="delivery_limit, rejected, ...")
@click.option("--since", help="30m, 2h, 1d or an ISO time")
@click.option("--status", type=click.Choice(["dead", "replayed", "discarded"]))
@click.option("--limit", default=100, type=click.IntRange(1, 10_000))
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def dlq_list(ctx: click.Context, order_id: str | None, reason: str | None, since: str | None,
             status: str | None, limit: int, as_json: bool) -> None:  # fmt: skip
    """The dead letters, newest first: why each died, whose it was, whether it blocks its
    order. `saga dlq show ID` tells one whole."""
    settings = settings_of(ctx)
    moment = parse_since(since)
    rows = run_async(
        with_store(
            settings, lambda s: _desk(settings, s).list(order_id, reason, moment, status, limit)
        )
    )
    if as_json:
        dump(rows)
        return
    keys = ("id", "status", "order_id", "message_type", "source_queue", "reason", "sender",
            "blocks_order", "delivery_count", "times_dead", "updated_at", "error")  # fmt: skip
    # the error in full is in `saga dlq show`; every other cell is whole
    table(keys, [[*(r[k] for k in keys[:-1]), clean(str(r["error"] or ""), 60)] for r in rows])


@dlq.command("show")
@click.argument("dead_letter_id", type=int)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def dlq_show(ctx: click.Context, dead_letter_id: int, as_json: bool) -> None:
    """Decoded body, headers, reason, error, and what is parked behind it."""
    settings = settings_of(ctx)
    found = run_async(with_store(settings, lambda s: _desk(settings, s).get(dead_letter_id)))
    body: bytes = found.pop("body")
    try:
        found["body"] = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        found["body"] = clean(body.decode("utf-8", "replace"), 20_000)
        found["body_undecodable"] = True
    if as_json:
        dump(found)
        return
    click.echo(_render(found))


def _render(found: dict[str, Any]) -> str:
    """The letter for a terminal: everything a sender chose is cleaned of control characters."""
    blocks = "blocks its order" if found["blocks_order"] else "holds no order"
    lines = [
        f"dead letter {found['id']}  [{found['status']}]  dead {found['times_dead']} time(s)",
        f"message:  {found['message_type']} {found['message_id']}",
        f"sender:   {found['sender'] or '(no user_id)'}   ({blocks})",
        f"order:    {found['order_id'] or '-'}   saga: {found['saga_id'] or '-'}",
        f"headed:   {found['exchange'] or '(default exchange)'} / {found['routing_key']}"
        f"   (queue {found['source_queue']})",
        f"reason:   {found['reason']} after {found['delivery_count']} delivery attempt(s)",
        f"error:    {found['error'] or '-'}",
        f"failed:   first {found['first_failed_at']}, last {found['last_failed_at']}",
        f"discard:  {found['discard_means']}",
        "body:",
        "  " + json.dumps(found["body"], indent=2, default=str).replace("\n", "\n  "),
        "headers:",
        "  " + json.dumps(found["headers"], indent=2, default=str).replace("\n", "\n  "),
    ]
    if found["blocks"]:
        lines.append("order blocked by:")
        lines += [f"  {b['message_id']} ({b['state']}): {b['reason']}" for b in found["blocks"]]
    parked = found["parked_behind"]
    lines.append(f"parked behind it: {len(parked)}")
    lines += [f"  {p['id']}: {p['message_type']} {p['message_id']} ({p['reason']})" for p in parked]
    for item in found["history"]:
        lines.append(
            f"earlier death: {item['reason']} at {item['last_failed_at']}: {item['error']}"
        )
    for entry in found["audit"]:
        who = f"{entry['actor']} ({entry['actor_role']})" if entry["actor_role"] else entry["actor"]
        lines.append(f"{entry['at']} {entry['action']} by {who}: {entry['note']}")
    return clean("\n".join(lines), 200_000)


@dlq.command("replay")
@click.argument("dead_letter_id", type=int, required=False)
@click.option("--order", "order_id", help="Every dead letter of this order, in order")
@click.option("--reason", "death_reason", help="Every dead letter that died for this reason")
@click.option("--all", "replay_all", is_flag=True, help="Every dead letter, per order in order")
@click.option("--note", default="", help="Why, for the audit trail")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def dlq_replay(ctx: click.Context, dead_letter_id: int | None, order_id: str | None,
               death_reason: str | None, replay_all: bool, note: str,
               as_json: bool) -> None:  # fmt: skip
    """Republish through the outbox to where the message was first headed. Idempotent. Sent to
    the running coordinator as the account the CLI connects as, which the audit trail names."""
    targets = [dead_letter_id is not None, order_id is not None, death_reason is not None]
    if sum(targets) + replay_all != 1:
        raise click.UsageError("give one of ID, --order ID, --reason REASON or --all")

    settings = settings_of(ctx)
    deadline = Deadline(None)

    async def work() -> DeskReply:
        with client_outcomes(
            as_json, _desk_not_answered("replay", deadline.seconds), follow="saga dlq list"
        ):
            bus = cli_bus(settings)
            async with SagaClient(bus, answer_within_s=deadline.for_answer()) as client:
                return await client.replay_dead_letters(
                    dead_letter_id=dead_letter_id,
                    order_id=order_id,
                    death_reason=death_reason,
                    every=replay_all,
                    note=note,
                    answer_within_s=deadline.for_answer(),
                )

    _report(run_async(work()), as_json)


@dlq.command("discard")
@click.argument("dead_letter_id", type=int)
@click.option("--reason", required=True, callback=not_blank, help="Why, for the audit trail")
@click.option("--yes", is_flag=True, help="Do not ask: discard with the meaning shown")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def dlq_discard(ctx: click.Context, dead_letter_id: int, reason: str, yes: bool,
                as_json: bool) -> None:  # fmt: skip
    """Give up on a dead letter. What that means for its saga is shown first (the same as
    `saga dlq show`), and asked to confirm unless --yes."""
    settings = settings_of(ctx)
    found = run_async(with_store(settings, lambda s: _desk(settings, s).get(dead_letter_id)))
    if not yes:
        click.echo(f"dead letter {dead_letter_id}: {found['message_type']} of order "
                   f"{found['order_id'] or '-'}")  # fmt: skip
        click.echo(f"discarding it means: {found['discard_means']}")
        if not click.confirm("discard it?", default=False):
            raise click.ClickException("not discarded")

    deadline = Deadline(None)  # from the answer to the question, if asked

    async def work() -> DeskReply:
        with client_outcomes(
            as_json, _desk_not_answered("discard", deadline.seconds), follow="saga dlq list"
        ):
            bus = cli_bus(settings)
            async with SagaClient(bus, answer_within_s=deadline.for_answer()) as client:
                return await client.discard_dead_letter(
                    dead_letter_id, reason=reason, answer_within_s=deadline.for_answer()
                )

    _report(run_async(work()), as_json)


def _desk_not_answered(operation: str, seconds: float) -> Callable[[NotAnswered], str]:
    """The paragraph for a desk command sent and not answered: it is not lost."""

    def said(exc: NotAnswered) -> str:
        times = "once" if exc.sends == 1 else f"{exc.sends} times"
        sent = f"it was sent {times} as message {exc.message_id}"
        if exc.queued:
            return (
                f"not answered within {seconds:g} s, but the {operation} is queued: "
                f"{sent} and RabbitMQ holds it. The coordinator does it when it runs; follow "
                "it with `saga dlq list`."
            )
        return (
            f"not answered within {seconds:g} s, and RabbitMQ did not confirm the "
            f"{operation}: {sent}, so it may be queued (then the coordinator does it when it "
            "runs) or lost. Look with `saga dlq list` before sending it again."
        )

    return said


def _report(reply: DeskReply, as_json: bool) -> None:
    if as_json:
        dump(list(reply.results))
        return
    for r in reply.results:
        click.echo(f"dead letter {r['id']}: {r['detail']}")
    if reply.reason:
        click.echo(reply.reason)
    if not reply.results:
        click.echo("no dead letters to replay")
