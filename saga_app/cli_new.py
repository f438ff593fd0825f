"""``saga new adapter NAME``: scaffold a service of one's own (see ``saga_services.scaffold``)."""

from __future__ import annotations

from pathlib import Path

import click

from saga_app.output import dump
from saga_services.scaffold import new_adapter
from saga_shared.errors import SagaError


@click.group()
def new() -> None:
    """Scaffold new parts of a deployment."""


@new.command()
@click.argument("name")
@click.option(
    "--dir", "into", envvar="SAGA_NEW_DIR", default=".", show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Where the package goes [SAGA_NEW_DIR]",
)  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print the files written as JSON")
def adapter(name: str, into: Path, as_json: bool) -> None:
    """A package NAME/ for a new service: its functions (service.py), its catalog entries
    (catalog.toml) and a test that runs without a broker (test_service.py)."""
    try:
        written = new_adapter(name, into)
    except SagaError as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:
        raise click.ClickException(f"cannot write {into / name}: {exc.strerror}") from None
    if as_json:
        dump({"package": str(into / name), "files": [str(p) for p in written]})
        return
    for path in written:
        click.echo(f"wrote {path}")
    click.echo(
        f"\nnext: add {into / name / 'catalog.toml'}'s entries to your catalog, test with\n"
        f"  PYTHONPATH={into} python -m pytest {into / name}\n"
        f"and run it beside the coordinator with\n"
        f"  PYTHONPATH={into} saga run {name}.service:SERVICE"
    )
