"""``saga setup``: roles on the broker and in Postgres, the topology, the schema. The only
command that needs administrator rights; everything it makes is listed in the permission
table of docs/explanation/trust.md."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import asdict
from pathlib import Path
from typing import get_args

import click

from saga_app.cli_support import run_async, settings_of
from saga_app.output import dump, table
from saga_coordinator.access import grants
from saga_coordinator.provision import (
    BrokerMethod,
    Report,
    database_passwords,
    declare_topology,
    default_broker_method,
    setup_broker,
    setup_database,
)
from saga_coordinator.tls import make_development_ca
from saga_shared.errors import SagaError

_HOST_NAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9*]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9-]+)*$")


def _hosts(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> tuple[str, ...]:
    """Names and addresses a certificate can be valid for: anything else would be written into
    it (and echoed) as it came."""
    for host in value:
        try:
            ipaddress.ip_address(host)
        except ValueError:
            if not _HOST_NAME.match(host):
                raise click.BadParameter(
                    f"{host!r} is neither a host name nor an IP address"
                ) from None
    return value


@click.command()
@click.option(
    "--secrets-dir",
    envvar="SAGA_SECRETS_DIR",
    help="Where passwords are kept and made [SAGA_SECRETS_DIR]",
)
@click.option(
    "--broker",
    "method",
    type=click.Choice(get_args(BrokerMethod)),
    envvar="SAGA_SETUP_BROKER",
    help="How to give the broker its users: rabbitmqctl on this machine (the default when it is "
    "here), the management API, or only a definitions file [SAGA_SETUP_BROKER]",
)
@click.option(
    "--broker-admin-url",
    envvar="SAGA_BROKER_ADMIN_URL",
    help="http(s)://admin:pass@host:15672 for --broker http [SAGA_BROKER_ADMIN_URL]",
)
@click.option(
    "--definitions-out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write the broker definitions (users, permissions) to this file",
)
@click.option("--database/--no-database", default=True, help="Also the Postgres roles")
@click.option(
    "--database-admin-url",
    envvar="SAGA_DATABASE_ADMIN_URL",
    help="A superuser (or CREATEROLE) URL; default SAGA_DATABASE_URL [SAGA_DATABASE_ADMIN_URL]",
)
@click.option("--print-table", is_flag=True, help="Only print the broker permission table")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def setup(
    ctx: click.Context,
    secrets_dir: str | None,
    method: BrokerMethod | None,
    broker_admin_url: str | None,
    definitions_out: Path | None,
    database: bool,
    database_admin_url: str | None,
    print_table: bool,
    as_json: bool,
) -> None:
    """Create each role's broker user and Postgres role with the narrowest rights, declare the
    topology, migrate. Passwords come from the secrets directory (made when missing)."""
    settings = settings_of(ctx)
    if print_table:
        rows = [
            (
                g.role,
                g.user,
                g.configure,
                g.write,
                g.read,
                "; ".join(f"{e}: write {w} read {r}" for e, w, r in g.topics),
            )
            for g in grants(settings)
        ]
        table(("role", "user", "configure", "write", "read", "topics"), rows)
        return
    if secrets_dir:
        settings = settings.with_(secrets_dir=str(Path(secrets_dir).resolve()))
    report = Report(secrets_dir=settings.secrets_dir)
    chosen: BrokerMethod = method or default_broker_method()

    try:
        setup_broker(
            settings, chosen, report, admin_url=broker_admin_url, definitions_out=definitions_out
        )
        passwords = database_passwords(settings) if database else {}
    except (ValueError, SagaError) as exc:
        raise click.ClickException(str(exc)) from None

    async def work() -> None:
        if chosen in ("rabbitmqctl", "http"):
            await declare_topology(settings)
        if database:
            admin = database_admin_url or settings.database_url
            await setup_database(settings, admin, passwords, report)

    run_async(work())
    if as_json:
        dump(asdict(report))
        return
    click.echo(
        f"broker: {len(report.broker_users)} users ({report.broker_method})"
        + (f", definitions in {report.definitions_file}" if report.definitions_file else "")
    )
    if database:
        click.echo(
            f"postgres: roles {', '.join(report.database_roles)}; "
            f"migrations applied: {report.migrations or 'none new'}"
        )
    click.echo(
        f"passwords in {report.secrets_dir}; run with SAGA_IDENTITY=roles "
        f"SAGA_SECRETS_DIR={report.secrets_dir}"
    )


@click.command("tls")
@click.option(
    "--dir",
    "directory",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Where to write ca.pem, server.pem, server.key",
)
@click.option(
    "--host",
    "hosts",
    multiple=True,
    default=("localhost", "127.0.0.1"),
    callback=_hosts,
    help="A name or address the server certificate is valid for (repeatable)",
)
def tls(directory: Path, hosts: tuple[str, ...]) -> None:
    """Make a development CA and a server certificate for the broker and the database."""
    files = make_development_ca(directory, list(hosts))
    click.echo(f"CA {files.ca}; server certificate {files.cert} and key {files.key} for "
               f"{', '.join(hosts)}")  # fmt: skip
    click.echo(f"clients: amqps://...?cafile={files.ca}  and  "
               f"postgresql://...?sslmode=verify-full&sslrootcert={files.ca}")  # fmt: skip
