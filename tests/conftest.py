"""Fixtures shared by every test folder, and the tiers, decided here by folder alone.

Each test is marked with its folder's name (``unit``, ``twins``, ``integration``, ``chaos``,
``docs``, ``packaging``). ``integration`` also marks every test that needs the real RabbitMQ or
Postgres: all of ``integration``, ``chaos`` and ``packaging``, and the real half of each
contract in ``twins``. ``fast`` marks the rest (the unit tests, the in-memory kit, the twins'
in-memory halves, the simulation's smoke run, the documentation's checks):
``bash scripts/test.sh --fast`` runs those, with neither service, and is what a developer runs
on every change.

Integration tests use the real RabbitMQ and Postgres named by SAGA_TEST_AMQP_URL and
SAGA_TEST_DATABASE_URL (default: the local services). Each run gets its own database and its own
namespace of queues and exchanges, both removed at the end.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import FrameType
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from saga_shared.config import Settings
from saga_shared.storage.migrations import drop_database, migrate

AMQP_URL = os.environ.get("SAGA_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
DATABASE_SERVER = os.environ.get("SAGA_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/")


TESTS = Path(__file__).parent
NEEDS_THE_STACK = {"integration", "chaos", "packaging"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        folder = item.path.relative_to(TESTS).parts[0]
        item.add_marker(folder)
        if folder in NEEDS_THE_STACK:
            item.add_marker("integration")
        elif item.get_closest_marker("integration") is None:
            item.add_marker("fast")


def _awaiting(coro: object) -> list[str]:
    """Where a coroutine waits, down its chain of awaits (a task's own stack stops at the top)."""
    lines = []
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is not None:
            lines.append(f"  {frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}")
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return lines


def _dump_tasks(signum: int, frame: FrameType | None) -> None:
    """Every task of the running loop, with where each awaits: pytest-timeout shows the threads
    only, and a hung test's threads all wait in the selector."""
    loop = asyncio._get_running_loop()
    print(f"\n--- the event loop's tasks, {TASK_DUMP_BEFORE_S:g}s before the timeout ---",
          file=sys.stderr)  # fmt: skip
    for task in asyncio.all_tasks(loop) if loop is not None else ():
        print(f"task {task.get_name()}:", *_awaiting(task.get_coro()), sep="\n", file=sys.stderr)
    sys.stderr.flush()


TASK_DUMP_BEFORE_S = 10.0


def pytest_configure(config: pytest.Config) -> None:
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGUSR2, _dump_tasks)


def _watched(item: pytest.Item) -> Iterator[None]:
    """A phase (setup, call, teardown: each has its own timeout) about to hit its timeout first
    has its loop's tasks printed (``_dump_tasks``)."""
    # The command line's --timeout, else pyproject's ``timeout`` (getoption alone misses it).
    limit = float(item.config.getoption("timeout", None) or item.config.getini("timeout") or 0)
    marker = item.get_closest_marker("timeout")
    if marker is not None and marker.args:
        limit = float(marker.args[0])
    timer = None
    if limit > 2 * TASK_DUMP_BEFORE_S:
        timer = threading.Timer(limit - TASK_DUMP_BEFORE_S, os.kill, (os.getpid(), signal.SIGUSR2))
        timer.daemon = True
        timer.start()
    try:
        yield
    finally:
        if timer is not None:
            timer.cancel()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    yield from _watched(item)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    yield from _watched(item)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    yield from _watched(item)


@pytest.fixture(autouse=True)
def logging_as_it_was() -> Iterator[None]:
    """A test that runs ``saga``'s group (CliRunner) has it configure logging: filters and a
    format on every root handler, pytest's own among them. What it changed is put back when the
    test ends, so no later test loses records to it."""
    root = logging.getLogger()
    kept = [(handler, list(handler.filters), handler.formatter) for handler in root.handlers]
    yield
    for handler, filters, formatter in kept:
        handler.filters[:] = filters
        handler.setFormatter(formatter)


@pytest.fixture(scope="session")
def run_id() -> str:
    return uuid.uuid4().hex[:8]


@pytest.fixture(scope="session")
def database_url(run_id: str) -> Iterator[str]:
    parts = urlsplit(DATABASE_SERVER)
    url = urlunsplit(parts._replace(path=f"/saga_test_{run_id}"))
    asyncio.run(migrate(url))
    yield url
    asyncio.run(drop_database(url))


@pytest.fixture
def settings(database_url: str, run_id: str) -> Settings:
    # A namespace per test keeps queues of one test from ever feeding another.
    return Settings(
        amqp_url=AMQP_URL,
        database_url=database_url,
        namespace=f"t{run_id}-{uuid.uuid4().hex[:6]}",
        partitions=4,
        delivery_limit=5,
        relay_poll_s=0.2,
        watchdog_s=0.3,
        # One broker account for everything: tests of who may send what run in roles mode
        # with their own vhost and users (tests/integration/roles.py).
        identity="shared",
    )


@pytest.fixture
async def pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    p = await asyncpg.create_pool(database_url, min_size=1, max_size=8)
    yield p
    await p.close()


@pytest.fixture
def order_id() -> str:
    return f"order-{uuid.uuid4().hex[:10]}"
