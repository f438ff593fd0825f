"""Headless Chromium (driven by Playwright) on a console over a running test stack: the
fixtures and steps the browser tests share.

``SAGA_CONSOLE_SCREENSHOTS=docs/console`` keeps each page's screenshot there
(docs/how-to/console.md shows them)."""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from playwright.async_api import Browser, Page, async_playwright, expect

from saga_app.console.accounts import with_account
from saga_app.console.settings import ConsoleSettings
from saga_app.stack import Stack
from saga_shared.client import SagaClient
from saga_shared.config import Settings
from saga_shared.transport.bus import Bus
from tests.integration.console_kit import PASSWORDS, accounts_file
from tests.integration.helpers import remove_namespace

CHROMIUM = os.environ.get("SAGA_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
assert Path(CHROMIUM).exists(), f"no Chromium at {CHROMIUM}: apt-get install chromium"
SHOTS = os.environ.get("SAGA_CONSOLE_SCREENSHOTS")
if SHOTS:
    Path(SHOTS).mkdir(parents=True, exist_ok=True)


@pytest.fixture
async def console_stack(settings: Settings, tmp_path: Path) -> AsyncIterator[tuple[Stack, str]]:
    config = ConsoleSettings(users=str(accounts_file(tmp_path)))
    stack = Stack(settings, ["all"], console=config)
    assert stack.console_runner is not None
    # A port the kernel picks, so parallel runs never collide.
    stack.console_runner.sock = socket.create_server(("127.0.0.1", 0))
    await stack.start()
    try:
        yield stack, stack.console_runner.address
    finally:
        await stack.stop()
        await remove_namespace(settings)


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield launched
        await launched.close()


@pytest.fixture
async def page(browser: Browser) -> Page:
    return await browser.new_page(viewport={"width": 1360, "height": 860})


@pytest.fixture
async def agent(console_stack: tuple[Stack, str]) -> AsyncIterator[SagaClient]:
    stack, _ = console_stack
    async with Bus(stack.settings) as bus, SagaClient(bus, answer_within_s=20) as client:
        yield client


async def shot(page: Page, name: str) -> None:
    if SHOTS:
        await page.screenshot(path=str(Path(SHOTS) / f"{name}.png"), full_page=True)


async def sign_in(
    page: Page, base: str, name: str, path: str = "/", password: str | None = None
) -> None:
    await page.goto(base + path)
    await expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    await page.get_by_label("Name").fill(name)
    await page.get_by_label("Password").fill(password or PASSWORDS[name])
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.locator("header .who")).to_contain_text(name)


@pytest.fixture
async def role_console(
    role_settings: Settings, tmp_path: Path
) -> AsyncIterator[tuple[Stack, str, dict[str, str]]]:
    """The stack and its console in ``roles`` mode, every component on its own account, as in
    production: the coordinator tells people from operators. The accounts: a person of
    ``SAGA_PEOPLE`` (``person``), an operator who is not one (``operator``), a viewer."""
    people = role_settings.people.split(",")
    names = {"person": people[0], "operator": "oli", "viewer": "vic"}
    users = tmp_path / "console-users.toml"
    for role, name in names.items():
        with_account(users, name, "viewer" if role == "viewer" else "operator", PASSWORDS[role])
    stack = Stack(role_settings, ["all"], console=ConsoleSettings(users=str(users)))
    assert stack.console_runner is not None
    stack.console_runner.sock = socket.create_server(("127.0.0.1", 0))
    await stack.start()
    try:
        yield stack, stack.console_runner.address, names
    finally:
        await stack.stop()
