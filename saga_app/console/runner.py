"""The console as a component of a process (``saga run console``, or beside the others)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket

import asyncpg

from saga_app.console.accounts import Accounts
from saga_app.console.app import Console, create_app
from saga_app.console.live import Hub, follow_events
from saga_app.console.reads import ConsoleReads
from saga_app.console.settings import ConsoleSettings
from saga_coordinator.gauges import SILENT_AFTER_BEATS
from saga_shared import http_server
from saga_shared.client import SagaClient
from saga_shared.model.catalog import Catalog
from saga_shared.security.identity import Directory
from saga_shared.transport.bus import Bus

log = logging.getLogger(__name__)


class ConsoleRunner:
    """The accounts file is read when made (a bad one stops the process at once); the port is
    bound by ``bind``, before the first request."""

    def __init__(self, config: ConsoleSettings, catalog: Catalog) -> None:
        self.config = config
        self.catalog = catalog
        self.accounts = Accounts.read(config.users)
        self.sock: socket.socket | None = None

    def bind(self) -> None:
        if self.sock is None:
            self.sock = http_server.bound_socket("SAGA_CONSOLE_BIND", self.config.bind)

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    @property
    def address(self) -> str:
        if self.sock is None:
            return "(not bound)"
        host, port = self.sock.getsockname()[:2]
        return f"http://{host}:{port}"

    async def run(self, bus: Bus, pool: asyncpg.Pool) -> None:
        hub = Hub()
        async with SagaClient(bus) as client:
            reads = ConsoleReads(pool, self.catalog, bus.topology)
            console = Console(
                self.catalog, reads, self.accounts, hub, client,
                Directory.from_settings(bus.settings),
                silent_after_s=bus.settings.heartbeat_s * SILENT_AFTER_BEATS,
                trace_url=self.config.trace_url,
            )  # fmt: skip
            secret = self.config.secret.get_secret_value() or None
            app = create_app(
                console,
                secret=secret,
                secure_cookie=self.config.secure_cookie,
                session_s=int(self.config.session_hours * 3600),
            )
            follower = asyncio.create_task(follow_events(bus, hub), name="console-events")
            log.warning("console on %s (%d accounts)", self.address, len(self.accounts.by_name))
            assert self.sock is not None, "bind() first"
            try:
                await http_server.serve(app, self.sock, on_stop=hub.close)
            finally:
                follower.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await follower
