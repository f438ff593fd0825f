"""Finding what a compensation undoes, and making "nothing to undo" a safe no-op.

The coordinator passes the forward result's id when it has one. When the forward action failed
with an unknown effect no id reached it, so the compensation reads the forward action's stored
outcome by its idempotency key instead.
"""

from __future__ import annotations

from services.errors import PermanentFailure
from services.params import optional_str
from services.store import Conn, Q, from_json, system_of
from shared.messages import ActionRequest


async def find_target(
    conn: Conn, req: ActionRequest, *, forward_action: str, id_field: str
) -> str | None:
    """The id of the entity to undo, or None when the forward action certainly did not land."""
    given = optional_str(req, id_field)
    if given is not None:
        return given
    forward_key = optional_str(req, "forward_key")
    if forward_key is None:
        raise PermanentFailure(f"{req.action}: give {id_field!r} or 'forward_key'")
    # Fence: when the forward call never ran, store it as failed under its own key. A forward
    # call still in flight (a timed-out request the broker redelivers late) then returns that
    # failure instead of landing after its compensation. When the forward call holds the key
    # right now, this insert waits for it, so the row read below is final.
    fenced = await conn.fetchval(
        Q.claim_key_as_failed,
        forward_key,
        system_of(forward_action),
        forward_action,
        req.order_id,
        f"not run: {req.action} ({req.idempotency_key}) compensated it first",
    )
    if fenced is not None:
        return None
    return await _id_from_stored(conn, req, forward_key, forward_action, id_field)


async def _id_from_stored(
    conn: Conn,
    req: ActionRequest,
    forward_key: str,
    forward_action: str,
    id_field: str,
) -> str | None:
    row = await conn.fetchrow(Q.stored_outcome, forward_key)
    if row is None or row["outcome"] != "done":
        return None
    if row["action"] != forward_action or row["order_id"] != req.order_id:
        raise PermanentFailure(
            f"{req.action}: forward_key {forward_key!r} belongs to {row['action']} "
            f"on order {row['order_id']}, not {forward_action} on {req.order_id}"
        )
    value = (from_json(row["result"]) or {}).get(id_field)
    if not isinstance(value, str):
        raise PermanentFailure(
            f"{req.action}: the stored result of {forward_key!r} has no {id_field}"
        )
    return value


async def lock_status(
    conn: Conn, req: ActionRequest, query: str, entity_id: str | None
) -> str | None:
    """Lock the target row and return its status; None when it does not exist."""
    if entity_id is None:
        return None
    row = await conn.fetchrow(query, entity_id)
    if row is None:
        return None
    if row["order_id"] != req.order_id:
        # Undoing another order's entity would be a silent disaster; refuse loudly.
        raise PermanentFailure(
            f"{req.action}: {entity_id} belongs to order {row['order_id']}, not {req.order_id}"
        )
    status: str = row["status"]
    return status
