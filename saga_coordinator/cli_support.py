"""Helpers shared by the ``saga`` command groups."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import asyncpg
import click

from saga_coordinator.store import Store
from shared.client import CommandRejected
from shared.config import Settings
from shared.errors import SagaError

T = TypeVar("T")
EXIT_REFUSED = 2
EXIT_TIMEOUT = 3


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    try:
        return asyncio.run(coro)
    except CommandRejected as exc:
        click.echo(f"refused: {exc.reason}", err=True)
        sys.exit(EXIT_REFUSED)
    except SagaError as exc:
        raise click.ClickException(str(exc)) from None
    except (OSError, asyncpg.PostgresError) as exc:
        raise click.ClickException(f"{type(exc).__name__}: {exc}") from None


def settings_of(ctx: click.Context) -> Settings:
    settings: Settings = ctx.obj
    return settings


def dump(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, default=str))


async def with_store(settings: Settings, work: Callable[[Store], Awaitable[T]]) -> T:
    pool = await asyncpg.create_pool(settings.database_url, min_size=1, max_size=2)
    try:
        return await work(Store(pool))
    finally:
        await pool.close()


async def with_pool(settings: Settings, work: Callable[[asyncpg.Pool], Awaitable[T]]) -> T:
    return await with_store(settings, lambda store: work(store.pool))
