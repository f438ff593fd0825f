"""A person's decisions about a saga: abort, approve, reject, resume, resolve.

Each is the same AMQP command an agent would publish, handled in the order's convoy; who decided
is the broker account the CLI connects as (``SAGA_ACT_AS``, or ``SAGA_AMQP_URL``'s user), never a
flag. ``--wait`` follows the saga to its next stop.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable

import click

from saga_app.cli_support import (
    EXIT_TIMEOUT,
    Seconds,
    cli_bus,
    not_blank,
    run_async,
    settings_of,
    with_store,
)
from saga_app.output import dump
from saga_coordinator.register import SagaState
from saga_coordinator.report import render_register
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
        async with cli_bus(settings) as bus, SagaClient(bus) as client:
            await send(client, order)
            if wait_s is not None:
                try:
                    await client.wait(saga_id, seconds=wait_s, stops=True)
                except TimeoutError:
                    click.echo(f"saga {saga_id}: no outcome within {wait_s}s", err=True)
                    sys.exit(EXIT_TIMEOUT)
        return await with_store(settings, lambda s: s.get(saga_id))

    print_outcome(saga_id, run_async(work()), as_json)


# client method, its text field, whether the text is required, and the command's help
DECISIONS: dict[str, tuple[str, bool, str]] = {
    "abort": ("reason", True, "Stop a saga: a step in flight finishes, then everything that may "
              "have landed is undone."),
    "approve": ("note", False, "Let a saga waiting at an approval gate go on."),
    "reject": ("reason", True, "Refuse at an approval gate: the saga compensates what landed."),
    "resume": ("note", False, "Continue compensating a saga in needs_human, skipping what is "
               "already undone."),
    "resolve": ("note", True, "A person takes over a saga in needs_human: it ends as resolved "
                "and its order is freed."),
}  # fmt: skip


def decision_command(name: str) -> click.Command:
    """One CLI command per decision, sent as the account the CLI connects as."""
    field, required, help_text = DECISIONS[name]

    @click.pass_context
    def command(ctx: click.Context, saga_id: str, text: str, wait_s: float | None,
                as_json: bool) -> None:  # fmt: skip
        async def send(client: SagaClient, order: str) -> None:
            decide = getattr(client, name)
            await decide(saga_id, order_id=order, **{field: text})

        _decide(ctx, saga_id, send, wait_s, as_json)

    command.__doc__ = help_text
    for option in (
        click.option("--json", "as_json", is_flag=True),
        click.option(
            "--wait", "wait_s", type=Seconds(), help="Wait this many seconds for the next stop"
        ),
        # (no default at all when required: click 8.5 takes default=None as a value given)
        click.option(
            f"--{field}", "text", required=True, callback=not_blank, help="Why, for the register"
        )
        if required
        else click.option(f"--{field}", "text", default="", help="Why, for the register"),
        click.argument("saga_id"),
    ):
        command = option(command)
    return click.command(name)(command)


abort, approve, reject, resume, resolve = (decision_command(n) for n in DECISIONS)
