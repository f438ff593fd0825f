"""``saga console-user``: add or change a console account (the file ``SAGA_CONSOLE_USERS``)."""

from __future__ import annotations

import secrets
import sys
from pathlib import Path

import click

from saga_app.console.accounts import ROLES, with_account
from saga_shared.errors import ConfigError


@click.command("console-user")
@click.argument("name")
@click.option(
    "--role",
    type=click.Choice(ROLES),
    default="viewer",
    show_default=True,
    help="viewer: reads everything; operator: also acts (approve, replay...)",
)
@click.option(
    "--file",
    "path",
    envvar="SAGA_CONSOLE_USERS",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The accounts file [SAGA_CONSOLE_USERS]",
)
@click.option("--password-stdin", is_flag=True, help="Read the password from stdin")
@click.option("--generate", is_flag=True, help="Make a random password and print it once")
def console_user(name: str, role: str, path: Path, password_stdin: bool, generate: bool) -> None:
    """Add a person to the console, or change their role or password. Only a hash is kept."""
    if password_stdin and generate:
        raise click.UsageError("give --password-stdin or --generate, not both")
    if generate:
        password = secrets.token_urlsafe(15)
    elif password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    elif sys.stdin.isatty():
        password = click.prompt("password", hide_input=True, confirmation_prompt=True)
    else:
        raise click.UsageError("not at a terminal: give --password-stdin or --generate")
    try:
        with_account(path, name, role, password)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"{name} ({role}) can sign in to the console; accounts in {path}", err=True)
    if generate:
        click.echo(password)
