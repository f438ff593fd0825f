"""The event loop every process runs on: uvloop where it is installed (its socket and timer
handling cost a fraction of asyncio's own, which is most of what these processes do), else the
standard loop."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency where it builds
        return asyncio.run(coro)
    return uvloop.run(coro)
