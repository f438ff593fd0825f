"""``saga mcp``: the catalog as MCP tools for an LLM agent (see ``mcp_tools``)."""

from __future__ import annotations

import click

from saga_coordinator.cli_support import settings_of
from saga_coordinator.mcp_tools import agent_bus, build_server
from shared.gateway import load_catalog


def _bind(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise click.BadParameter(f"{text!r}: write HOST:PORT, e.g. 127.0.0.1:8765")
    return host, int(port)


@click.command()
@click.option(
    "--transport", envvar="SAGA_MCP_TRANSPORT", default="stdio",
    type=click.Choice(["stdio", "streamable-http"]),
    help="stdio for a client that starts this process; streamable-http to serve several "
    "[SAGA_MCP_TRANSPORT]",
)  # fmt: skip
@click.option(
    "--bind", envvar="SAGA_MCP_BIND", default="127.0.0.1:8765",
    help="With streamable-http: HOST:PORT [SAGA_MCP_BIND]",
)  # fmt: skip
@click.pass_context
def mcp(ctx: click.Context, transport: str, bind: str) -> None:
    """Serve the catalog as MCP tools for an LLM agent, acting as an agent's account: list
    actions and sagas, check a plan, start, follow, read and abort sagas. No tool approves,
    resolves, replays or discards; those stay with people."""
    settings = settings_of(ctx)
    host, port = _bind(bind)
    try:
        agent_bus(settings)  # refuses a person's or the operators' account before serving
    except PermissionError as exc:
        raise click.ClickException(str(exc)) from None
    server = build_server(settings, load_catalog(settings.catalog_file))
    if transport == "stdio":
        server.run("stdio")  # stdout carries the protocol: logs go to stderr
    else:
        server.run("streamable-http", host=host, port=port)
