"""A console in this process, over a running test stack, and a way to sign in to it."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx

from saga_app.console.accounts import Accounts, with_account
from saga_app.console.app import Console, create_app
from saga_app.console.live import Hub
from saga_app.console.reads import ConsoleReads
from saga_app.stack import Stack
from saga_shared.client import SagaClient
from saga_shared.security.identity import Directory
from saga_shared.transport.bus import Bus

PASSWORDS = {
    "ana": "ana-long-password", "vic": "vic-long-password",
    # by role, for the accounts of the roles-mode console (tests/integration/browser.py)
    "person": "a-person-long-password", "operator": "an-operator-long-password",
    "viewer": "a-viewer-long-password",
}  # fmt: skip
_CSRF = re.compile(r'name="csrf" value="([^"]+)"')


def accounts_file(directory: Path) -> Path:
    """ana operates, vic only looks."""
    path = directory / "console-users.toml"
    with_account(path, "ana", "operator", PASSWORDS["ana"])
    with_account(path, "vic", "viewer", PASSWORDS["vic"])
    return path


@asynccontextmanager
async def console_http(stack: Stack, users: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with Bus(stack.settings) as bus, SagaClient(bus, answer_within_s=20) as client:
        reads = ConsoleReads(stack.pool, stack.catalog, bus.topology)
        console = Console(stack.catalog, reads, Accounts.read(str(users)), Hub(), client,
                          Directory.from_settings(stack.settings.with_(people="ana")))  # fmt: skip
        transport = httpx.ASGITransport(app=create_app(console))
        async with httpx.AsyncClient(transport=transport, base_url="http://console.test") as http:
            yield http


def csrf_of(html: str) -> str:
    found = _CSRF.search(html)
    assert found is not None, "the page has no form token"
    return found.group(1)


async def token(http: httpx.AsyncClient, path: str = "/login") -> str:
    return csrf_of((await http.get(path)).text)


async def sign_in(
    http: httpx.AsyncClient, name: str, password: str | None = None
) -> httpx.Response:
    form = {"name": name, "password": password or PASSWORDS[name], "csrf": await token(http)}
    return await http.post("/login", data=form)
