"""Serving an ASGI app (the HTTP payments API, the console) inside a process that has its own
signal handling: the socket is bound first, so a port in use is an error at start."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable, Iterator

import uvicorn
from starlette.types import ASGIApp

from saga_shared.config import parse_bind
from saga_shared.errors import ConfigError


def bound_socket(setting: str, bind: str) -> socket.socket:
    """The listening socket for ``host:port``, or a ConfigError naming the setting."""
    host, port = parse_bind(setting, bind)
    try:
        return socket.create_server((host, port), reuse_port=False)
    except OSError as exc:
        raise ConfigError(f"{setting} {bind!r}: cannot listen there ({exc})") from None


async def serve(
    app: ASGIApp, sock: socket.socket, on_stop: Callable[[], None] | None = None
) -> None:
    """Serve ``app`` on ``sock`` until cancelled, then stop gracefully: requests in flight get
    a few seconds; ``on_stop`` ends what would never end by itself (event streams)."""
    config = uvicorn.Config(app, lifespan="off", log_level="warning", timeout_graceful_shutdown=5)
    server = _Server(config)
    task = asyncio.ensure_future(server.serve(sockets=[sock]))
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        if on_stop is not None:
            on_stop()
        server.should_exit = True
        with contextlib.suppress(Exception):
            await task
        raise


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # the process's own handlers stop the stack, and this server with it
