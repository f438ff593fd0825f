"""A person's decisions about a saga: abort, approve, reject, resume, resolve, settle.

Each is the same AMQP command an agent would publish, handled in the order's convoy; who decided
is the broker account the CLI connects as (``SAGA_ACT_AS``, or ``SAGA_AMQP_URL``'s user), never a
flag. ``--wait`` follows the saga to its next stop.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Awaitable, Callable

import click

from saga_app.cli_support import (
    ANSWER_WITHIN_S,
    EXIT_TIMEOUT,
    Deadline,
    Seconds,
    cli_bus,
    client_outcomes,
    not_blank,
    run_async,
    settings_of,
    with_store,
)
from saga_app.output import dump
from saga_coordinator.register import SagaState
from saga_coordinator.report import render_register
from saga_shared.client import NotAnswered, SagaClient
from saga_shared.config import Settings

# Sends the decision: the client, the register as read, how long the answer may take.
Send = Callable[[SagaClient, SagaState, float], Awaitable[None]]


async def lookup(settings: Settings, saga_id: str) -> SagaState:
    state = await with_store(settings, lambda s: s.get(saga_id))
    if state is None:
        raise click.ClickException(f"no saga {saga_id}")
    return state


def gate_step(state: SagaState) -> int | None:
    """The gate the saga waits at, as read: an approval sent again never opens the next."""
    return next((s.index for s in state.steps if s.gate_status == "waiting"), None)


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
    deadline = Deadline(wait_s)  # the whole command, the order's look-up included
    name = ctx.command.name or "decision"

    async def work() -> SagaState | None:
        read = await lookup(settings, saga_id)
        unanswered = functools.partial(_decision_not_answered, name, deadline.seconds)
        with client_outcomes(as_json, unanswered, follow=f"saga show {saga_id}"):
            bus = cli_bus(settings)
            async with SagaClient(bus, answer_within_s=deadline.for_answer()) as client:
                await send(client, read, deadline.for_answer())
                if wait_s is not None:
                    try:
                        await client.wait(saga_id, seconds=deadline.left(), stops=True)
                    except TimeoutError:
                        click.echo(f"saga {saga_id}: no outcome within {wait_s}s", err=True)
                        sys.exit(EXIT_TIMEOUT)
        return await with_store(settings, lambda s: s.get(saga_id))

    print_outcome(saga_id, run_async(work()), as_json)


def _decision_not_answered(name: str, seconds: float, exc: NotAnswered) -> str:
    """The paragraph for a decision sent and not answered: it is not lost."""
    sid = exc.saga_id or ""
    times = "once" if exc.sends == 1 else f"{exc.sends} times"
    sent = f"it was sent {times} as message {exc.message_id}"
    # The coordinator may be down, or running and holding the answer: an abort is answered
    # once the step in flight that cannot be undone is settled. Which one, nobody here knows.
    held = (" (or it is applied and waits for a step in flight that cannot be undone to be "
            "settled, which its answer will name)" if name == "abort" else "")  # fmt: skip
    if exc.queued:
        return (
            f"not answered within {seconds:g} s, but the {name} of saga {sid} is queued: "
            f"{sent} and RabbitMQ took it. It will be applied when the coordinator runs{held}, "
            f"unless the coordinator refuses it (then it says why); follow it with "
            f"`saga show {sid}`."
        )
    return (
        f"not answered within {seconds:g} s, and RabbitMQ did not confirm the {name} of "
        f"saga {sid}: {sent}, so it may be queued (then it will be applied when the "
        f"coordinator runs) or lost. Look with `saga show {sid}` before deciding again."
    )


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
        async def send(client: SagaClient, read: SagaState, within_s: float) -> None:
            decide = getattr(client, name)
            gate = {"step": gate_step(read)} if name in ("approve", "reject") else {}
            await decide(saga_id, order_id=read.order_id, answer_within_s=within_s,
                         **{field: text}, **gate)  # fmt: skip

        _decide(ctx, saga_id, send, wait_s, as_json)

    command.__doc__ = help_text
    for option in (
        click.option("--json", "as_json", is_flag=True),
        click.option(
            "--wait",
            "wait_s",
            type=Seconds(),
            help="Wait for the next stop: the whole command takes about this many seconds at "
            f"most [without it: {ANSWER_WITHIN_S:g} s, to the answer]",
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


@click.command()
@click.argument("saga_id")
@click.option(
    "--step",
    "step",
    type=click.IntRange(0, 999),
    default=None,
    help="The step in doubt [default: the saga's one step in doubt]",
)
@click.option(
    "--happened/--did-not-happen",
    "happened",
    default=None,
    help="What the system itself says (its log, its record)",
)
@click.option(
    "--note", "note", required=True, callback=not_blank, help="How you know, for the register"
)
@click.option(
    "--wait",
    "wait_s",
    type=Seconds(),
    help="Wait for the next stop: the whole command takes about this many seconds at most",
)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def settle(ctx: click.Context, saga_id: str, step: int | None, happened: bool | None, note: str,
           wait_s: float | None, as_json: bool) -> None:  # fmt: skip
    """Settle a step in doubt, as a person: it happened, or it did not. "Did not happen" takes
    effect once the step's service has fenced its key (refused while a call holds it); the
    decision names the register's version it was made on, so an answer that came first wins."""
    if happened is None:
        raise click.UsageError("say which way it went: --happened or --did-not-happen")

    async def send(client: SagaClient, read: SagaState, within_s: float) -> None:
        doubtful = [s.index for s in read.steps if s.status == "in_doubt"]
        which = step if step is not None else (doubtful[0] if len(doubtful) == 1 else None)
        if which is None:
            raise click.ClickException(f"saga {saga_id} has no step in doubt (it is {read.status})")
        reply = await client.settle(saga_id, order_id=read.order_id, step=which,
                                    happened=bool(happened), note=note, version=read.version,
                                    answer_within_s=within_s)  # fmt: skip
        if not as_json and reply.reason:
            click.echo(reply.reason, err=True)

    _decide(ctx, saga_id, send, wait_s, as_json)
