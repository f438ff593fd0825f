"""``saga mcp``: the catalog as MCP tools for an LLM agent (see ``mcp_tools``)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
from collections.abc import Iterator

import click
from aiormq.exceptions import AMQPError

from saga_app.cli_support import run_async, settings_of
from saga_app.mcp_tools import agent_bus, build_server, connected
from saga_shared.config import Settings, parse_bind
from saga_shared.errors import ConfigError
from saga_shared.model.catalog import Catalog
from saga_shared.model.gateway import load_catalog


async def _reachable(settings: Settings, catalog: Catalog) -> None:
    """Connect once before serving, so that a broker that is away or a system not yet set up
    is a clear error here rather than a session that dies when a client attaches."""
    try:
        with _quiet("aiormq", "aio_pika"):
            async with connected(settings, catalog):
                return
    except (OSError, AMQPError) as exc:
        raise click.ClickException(
            f"cannot reach the saga system on the broker ({exc}): is it running, with its "
            "topology declared (`saga run`, `saga declare`), and SAGA_AMQP_URL and "
            "SAGA_NAMESPACE pointing at it?"
        ) from None


@contextlib.contextmanager
def _quiet(*loggers: str) -> Iterator[None]:
    """The client library's own lines about a failed connection, silenced for the one attempt
    that is said in one line below; once serving, its reconnect lines are worth reading."""
    found = [logging.getLogger(name) for name in loggers]
    levels = [logger.level for logger in found]
    for logger in found:
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for logger, level in zip(found, levels, strict=True):
            logger.setLevel(level)


def _exit_now(signum: int, frame: object) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(128 + signum)


def _bind(text: str) -> tuple[str, int]:
    try:
        return parse_bind("--bind", text)
    except ConfigError as exc:
        raise click.BadParameter(str(exc)) from None


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
    catalog = load_catalog(settings.catalog_file)
    run_async(_reachable(settings, catalog))
    server = build_server(settings, catalog)
    if transport == "stdio":
        # The SDK reads stdin in a worker thread, which no cancellation can stop: on Ctrl-C or
        # SIGTERM the process would wait for the client to close stdin. Nothing here needs a
        # graceful end (what a tool sent is on the broker already), so it ends at once.
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, _exit_now)
        server.run("stdio")  # stdout carries the protocol: logs go to stderr
    else:
        server.run("streamable-http", host=host, port=port)
