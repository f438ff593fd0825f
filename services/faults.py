"""Fault injection per action and order: a product feature for rehearsing failures.

"A compensation that has never been exercised is a hope with a function name": a user injects
``permanent`` (the system refuses), ``transient:N`` (the next N calls fail, then it works) or
``hang`` / ``hang:N`` (every call, or the next N, never answers: the adapter's timeout ends each
and the effect is unknown) on any action, compensations included, and watches the saga handle
it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection

import asyncpg

from saga_services.errors import Permanent, Transient
from saga_services.registry import all_actions
from saga_services.store import Q, row_dict
from saga_shared.model.messages import ActionRequest

MAX_TRANSIENT = 1000


def parse_mode(text: str) -> tuple[str, int | None]:
    """``"permanent"`` -> ``("permanent", None)``; ``"transient:N"`` -> ``("transient", N)``;
    ``"hang"`` (every call) or ``"hang:N"`` (the next N calls) -> ``("hang", N or None)``."""
    mode, sep, count = text.strip().partition(":")
    if mode in ("permanent", "hang") and not sep:
        return mode, None
    if mode in ("transient", "hang") and sep:
        try:
            n = int(count)
        except ValueError:
            n = 0
        if 1 <= n <= MAX_TRANSIENT:
            return mode, n
        raise ValueError(
            f"fault mode {text!r}: N in '{mode}:N' must be a whole number 1..{MAX_TRANSIENT}"
        )
    raise ValueError(
        f"fault mode {text!r}: use 'permanent', 'transient:N', 'hang' or 'hang:N' (N = 1..1000)"
    )


def check_action(action: str, own: Collection[str] = ()) -> None:
    """Faults apply to the simulated systems' actions and to ``own``, those of one's own
    services: ValueError naming them otherwise."""
    if action not in all_actions() and action not in own:
        known = ", ".join([*all_actions(), *sorted(own)])
        raise ValueError(f"unknown action {action!r} (known: {known})")


async def add_fault(
    pool: asyncpg.Pool, action: str, order_id: str, mode: str, own: Collection[str] = ()
) -> None:
    """Inject a fault, replacing any fault already set on this action and order."""
    check_action(action, own)
    if not order_id:
        raise ValueError("order_id must not be empty")
    kind, remaining = parse_mode(mode)
    await pool.execute(Q.upsert_fault, action, order_id, kind, remaining)


async def list_faults(pool: asyncpg.Pool) -> list[dict[str, object]]:
    return [row_dict(row) for row in await pool.fetch(Q.list_faults)]


async def clear_faults(pool: asyncpg.Pool, order_id: str | None) -> int:
    """Remove the faults of one order, or every fault when ``order_id`` is None."""
    cleared: int = await pool.fetchval(Q.clear_faults, order_id)
    return cleared


class Rehearsal:
    """The faults of a service of one's own, applied by its adapter before each call when it
    runs with ``SAGA_INJECT_FAULTS=true`` (one statement more per call; the simulated systems
    apply theirs inside their own statement): the call fails as it would have, and nothing
    reaches the service."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    async def before(self, req: ActionRequest) -> None:
        mode = await self.pool.fetchval(Q.take_fault, req.action, req.order_id)
        if mode == "permanent":
            raise Permanent(f"injected permanent fault on {req.action}")
        if mode == "transient":
            raise Transient(f"injected transient fault on {req.action}")
        if mode == "hang":
            await asyncio.Event().wait()  # no answer: the call's timeout ends it, as a real hang
