"""A person's decisions about a saga: abort, approve, reject, resume, resolve.

Each is the same AMQP command an agent would publish (``by_kind="person"``), handled in the
order's convoy; ``--wait`` follows the saga to its next stop.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable

import click

from saga_coordinator.cli_dlq import actor_option
from saga_coordinator.cli_support import EXIT_TIMEOUT, dump, run_async, settings_of, with_store
from saga_coordinator.register import SagaState
from saga_coordinator.report import render_register
from shared.bus import Bus
from shared.client import SagaClient
from shared.config import Settings

Send = Callable[[SagaClient, str], Awaitable[None]]


async def lookup_order(settings: Settings, saga_id: str) -> str:
    order = await with_store(settings, lambda s: s.order_of(saga_id))
    if order is None:
        raise click.ClickException(f"no saga {saga_id}")
    return order


def print_outcome(saga_id: str, state: SagaState | None, as_json: bool) -> None:
    if as_json:
        dump({"saga_id": saga_id} if state is None else state.register())
    elif state is None:
        click.echo(f"accepted: saga {saga_id}")
    else:
        click.echo(render_register(state))


def _decide(
    ctx: click.Context, saga_id: str, send: Send, wait_s: float | None, as_json: bool
) -> None:
    settings = settings_of(ctx)

    async def work() -> SagaState | None:
        order = await lookup_order(settings, saga_id)
        async with Bus(settings) as bus, SagaClient(bus) as client:
            await send(client, order)
            if wait_s is not None:
                try:
                    await client.wait(saga_id, seconds=wait_s, stops=True)
                except TimeoutError:
                    click.echo(f"saga {saga_id}: no outcome within {wait_s}s", err=True)
                    sys.exit(EXIT_TIMEOUT)
        return await with_store(settings, lambda s: s.get(saga_id))

    print_outcome(saga_id, run_async(work()), as_json)


wait_option = click.option(
    "--wait", "wait_s", type=float, help="Wait this many seconds for the next stop"
)
json_option = click.option("--json", "as_json", is_flag=True)


@click.command()
@click.argument("saga_id")
@click.option("--reason", required=True, help="Why, for the register")
@actor_option
@wait_option
@json_option
@click.pass_context
def abort(ctx: click.Context, saga_id: str, reason: str, actor: str, wait_s: float | None,
          as_json: bool) -> None:  # fmt: skip
    """Stop a saga: a step in flight finishes, then everything that may have landed is undone."""

    async def send(client: SagaClient, order: str) -> None:
        await client.abort(saga_id, order_id=order, reason=reason, by=actor, person=True)

    _decide(ctx, saga_id, send, wait_s, as_json)


@click.command()
@click.argument("saga_id")
@click.option("--note", default="", help="Why, for the register")
@actor_option
@wait_option
@json_option
@click.pass_context
def approve(ctx: click.Context, saga_id: str, note: str, actor: str, wait_s: float | None,
            as_json: bool) -> None:  # fmt: skip
    """Let a saga waiting at an approval gate go on."""

    async def send(client: SagaClient, order: str) -> None:
        await client.approve(saga_id, order_id=order, note=note, by=actor, person=True)

    _decide(ctx, saga_id, send, wait_s, as_json)


@click.command()
@click.argument("saga_id")
@click.option("--reason", required=True, help="Why, for the register")
@actor_option
@wait_option
@json_option
@click.pass_context
def reject(ctx: click.Context, saga_id: str, reason: str, actor: str, wait_s: float | None,
           as_json: bool) -> None:  # fmt: skip
    """Refuse at an approval gate: the saga compensates what has landed."""

    async def send(client: SagaClient, order: str) -> None:
        await client.reject(saga_id, order_id=order, reason=reason, by=actor, person=True)

    _decide(ctx, saga_id, send, wait_s, as_json)


@click.command()
@click.argument("saga_id")
@click.option("--note", default="", help="Why, for the register")
@actor_option
@wait_option
@json_option
@click.pass_context
def resume(ctx: click.Context, saga_id: str, note: str, actor: str, wait_s: float | None,
           as_json: bool) -> None:  # fmt: skip
    """Continue compensating a saga in needs_human, skipping what is already undone."""

    async def send(client: SagaClient, order: str) -> None:
        await client.resume(saga_id, order_id=order, note=note, by=actor, person=True)

    _decide(ctx, saga_id, send, wait_s, as_json)


@click.command()
@click.argument("saga_id")
@click.option("--note", required=True, help="What was decided, for the register")
@actor_option
@json_option
@click.pass_context
def resolve(ctx: click.Context, saga_id: str, note: str, actor: str, as_json: bool) -> None:
    """A person takes over a saga in needs_human: it ends as resolved and its order is freed."""

    async def send(client: SagaClient, order: str) -> None:
        await client.resolve(saga_id, order_id=order, note=note, by=actor)

    _decide(ctx, saga_id, send, 30.0, as_json)
