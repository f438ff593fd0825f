"""The event loop every process runs on: uvloop where it is installed (its socket and timer
handling cost a fraction of asyncio's own, which is most of what these processes do), else the
standard loop.

The cyclic garbage collector is tuned for a long-running message loop: the modules, catalog
and models loaded at start are frozen out of its scans (they live as long as the process),
and a young collection runs every ``GC_YOUNG`` net allocations instead of every 700. Each
message allocates a few thousand short-lived objects, nearly all freed by reference counting;
at the default the collector ran several times per message and took 3% of a coordinator's
CPU under load (py-spy, ``gc_collect_main``)."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

GC_YOUNG = 20_000


def tune_gc() -> None:
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG, older, oldest)


def run(coro: Coroutine[Any, Any, T]) -> T:
    tune_gc()
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency where it builds
        return asyncio.run(coro)
    return uvloop.run(coro)


def stop_after_s(seconds: float) -> Callable[[object], bool]:
    """tenacity's ``stop_after_delay`` on the running loop's clock (made where the retries
    start): the same monotonic time in a process, the virtual clock in the simulation, where
    how long a hold lasts must not depend on how busy the machine is."""
    loop = asyncio.get_running_loop()
    began = loop.time()
    return lambda _state: loop.time() - began >= seconds
