"""The operators' desk: what a person or an operations account does with a dead letter.

Replay and discard arrive as commands (``dlq.replay``, ``dlq.discard``) through the intake, so
the actor recorded is the broker-verified sender. Each operation on one letter is one
transaction, under its order's lock.

Discarding has one definite meaning per kind of letter (``discard_meaning``, shown by ``saga dlq
show`` before anyone confirms): a command never happened; a request's step ends failed with its
effect unknown (or, for a compensation, the saga stops at ``needs_human``) and the request is
never sent again; an outcome is as if lost (the step's deadline asks again, under the same key);
a deadline fires again. A letter that holds no order changes nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic import JsonValue, TypeAdapter

from saga_coordinator.dead_letters import REPLAY_HEADER, Q
from saga_coordinator.processor import Processor
from saga_coordinator.rows import OutboxRow
from saga_coordinator.store import Store, Tx
from saga_shared.errors import SagaError
from saga_shared.model.messages import (
    ActionFailed,
    ActionRequest,
    DeadlineReached,
    DeskCommand,
    DeskReply,
    ReplayDeadLetters,
)
from saga_shared.model.text import clean

_REQUEST: TypeAdapter[ActionRequest] = TypeAdapter(ActionRequest)
_DEADLINE: TypeAdapter[DeadlineReached] = TypeAdapter(DeadlineReached)
MAX_RESULTS = 500  # per reply; a bigger replay says how many more it did


class DeadLetterNotFound(SagaError):
    pass


@dataclass(frozen=True)
class Handled:
    dead_letter_id: int
    done: bool
    detail: str

    def as_dict(self) -> dict[str, JsonValue]:
        return {"id": self.dead_letter_id, "done": self.done, "detail": self.detail}


def _kind(row: Any) -> str:
    kind = row["message_type"] or ""
    if kind == "action.request":
        try:
            return "compensation" if _REQUEST.validate_json(row["body"]).phase == "compensation" \
                else "request"  # fmt: skip
        except ValueError:
            return "other"
    if kind.startswith("action."):
        return "outcome"
    if kind == "saga.deadline":
        return "deadline"
    return "command" if kind.startswith("saga.") else "other"


def discard_meaning(row: Any) -> str:
    """What discarding this dead letter does to its saga, in words."""
    if not row["blocks_order"] or not row["order_id"]:
        return "nothing changes for any saga: this letter holds no order; it is kept, discarded"
    return {
        "command": "the command never happened: later commands of its order stop waiting for it",
        "request": "the step ends failed with its effect unknown; the saga compensates what may "
        "have landed, this step included, and the request is never sent again",
        "compensation": "the compensation ends failed: the saga stops at needs_human, and the "
        "request is never sent again",
        "outcome": "as if the outcome was lost: the step's deadline sends the request again under "
        "the same idempotency key, so it takes effect at most once",
        "deadline": "the step's timer fires again now",
        "other": "its order is unblocked; nothing else changes",
    }[_kind(row)]


class DeadLetterDesk:
    def __init__(self, store: Store, processor: Processor) -> None:
        self.store = store
        self.processor = processor
        self.topology = processor.topology

    async def perform(self, command: DeskCommand) -> DeskReply:
        sender = command.sender
        actor, role = (sender.user, sender.acting_as) if sender else ("", "")
        try:
            if isinstance(command, ReplayDeadLetters):
                if command.dead_letter_id is not None:
                    ids = [command.dead_letter_id]
                else:
                    ids = await self.ids(command.order_id, command.death_reason)
                results = [await self.replay(i, actor, command.note, role) for i in ids]
            else:
                results = [await self.discard(command.dead_letter_id, actor, command.reason, role)]
        except DeadLetterNotFound as exc:
            return DeskReply(type="desk.refused", command_id=command.message_id,
                             command_type=command.type, reason=str(exc))  # fmt: skip
        shown = results[:MAX_RESULTS]
        more = f"and {len(results) - len(shown)} more" if len(results) > len(shown) else ""
        return DeskReply(
            type="desk.done", command_id=command.message_id, command_type=command.type,
            reason=more, results=tuple(r.as_dict() for r in shown),
        )  # fmt: skip

    def _reenters_convoy(self, exchange: str) -> bool:
        # Such a message comes back through the order's partition with its block's id and lifts
        # the block itself when handled; any other (an action request) lifts it now.
        t = self.topology
        return exchange in (t.partitions_exchange, t.outcomes_exchange, t.commands_exchange)

    async def replay(self, dl_id: int, actor: str, note: str = "", role: str = "") -> Handled:
        async def work(tx: Tx) -> Handled:
            row = await self._lock(tx, dl_id)
            if row["status"] != "dead":
                return Handled(dl_id, False, f"already {row['status']}: nothing republished")
            tx.outbox([
                OutboxRow(row["exchange"], row["routing_key"], row["message_id"],
                          row["message_type"] or "unknown", row["order_id"] or "", row["body"],
                          {REPLAY_HEADER: str(dl_id)})
            ])  # fmt: skip
            await tx.conn.execute(Q.dl_set_status, dl_id, "replayed")
            await tx.conn.execute(Q.audit_insert, dl_id, "replay", actor, role, clean(note))
            await tx.conn.execute(Q.failure_delete, row["message_id"])
            target = f"{row['exchange'] or '(default)'} / {row['routing_key']}"
            if row["blocks_order"] and row["order_id"] is not None:
                key = row["block_key"] or row["message_id"]
                if self._reenters_convoy(row["exchange"]):
                    await tx.block(row["order_id"], key, "replaying", f"replayed by {actor}")
                else:
                    await self.processor.release(tx, row["order_id"], key, _now())
            return Handled(dl_id, True, f"republished to {target}")

        return await self.store.run(work)

    async def discard(self, dl_id: int, actor: str, reason: str, role: str = "") -> Handled:
        async def work(tx: Tx) -> Handled:
            row = await self._lock(tx, dl_id)
            if row["status"] == "discarded":
                return Handled(dl_id, False, "already discarded")
            if row["status"] == "replayed":
                return Handled(dl_id, False, "replayed and in flight: discard it if it dies again")
            await tx.conn.execute(Q.dl_set_status, dl_id, "discarded")
            await tx.conn.execute(Q.audit_insert, dl_id, "discard", actor, role, clean(reason))
            meaning = discard_meaning(row)
            if row["blocks_order"] and row["order_id"] is not None:
                await self._settle_discarded(tx, row, actor, reason)
            return Handled(dl_id, True, f"discarded: {meaning}")

        return await self.store.run(work)

    async def _settle_discarded(self, tx: Tx, row: Any, actor: str, reason: str) -> None:
        key = row["block_key"] or row["message_id"]
        kind = _kind(row)
        replacement = None
        if kind == "command":
            await self._skip_its_number(tx, row["order_id"], key)
        elif kind in ("request", "compensation"):
            request = _REQUEST.validate_json(row["body"])
            why = f"its request was dead-lettered and discarded by {actor}: {reason}"
            replacement = ActionFailed(
                message_id=f"discarded:{row['id']}", saga_id=request.saga_id,
                order_id=request.order_id, action=request.action, phase=request.phase,
                step=request.step, idempotency_key=request.idempotency_key,
                attempt=request.attempt, reason=clean(why, 4000), effect_unknown=True,
            )  # fmt: skip
        elif kind == "deadline":
            d = _DEADLINE.validate_json(row["body"])
            await tx.conn.execute(Q.deadline_rearm, d.saga_id, d.order_id, d.step, d.phase,
                                  d.idempotency_key, d.attempt)  # fmt: skip
        await self.processor.discard(tx, row["order_id"], key, replacement, _now())

    async def _skip_its_number(self, tx: Tx, order_id: str, key: str) -> None:
        """A discarded command never arrives: later commands of its order must not wait for it."""
        seq = await tx.conn.fetchval(Q.seq_of_message, key)
        if seq is not None:
            await tx.conn.execute(
                Q.tombstone_insert, order_id, f"skip:{key}", seq, f"command {seq} discarded"
            )

    async def _lock(self, tx: Tx, dl_id: int) -> Any:
        row = await tx.conn.fetchrow(Q.dl_lock, dl_id)
        if row is None:
            raise DeadLetterNotFound(f"no dead letter {dl_id}")
        return row

    # --- reads ----------------------------------------------------------------------------------
    async def ids(self, order_id: str | None, reason: str | None = None) -> list[int]:
        """The dead letters to replay (all, or an order's, or those of one reason), each
        order's in its arrival order."""
        rows = await self.store.pool.fetch(Q.dl_ids_dead, order_id, reason)
        return [r["id"] for r in rows]

    async def list(
        self,
        order_id: str | None = None,
        reason: str | None = None,
        since: datetime | None = None,
        status: str | None = None,
        limit: int = 100,
    ) -> list[dict[str, Any]]:
        rows = await self.store.pool.fetch(Q.dl_list, order_id, reason, since, status, limit)
        return [dict(r) for r in rows]

    async def get(self, dl_id: int) -> dict[str, Any]:
        row = await self.store.pool.fetchrow(Q.dl_get, dl_id)
        if row is None:
            raise DeadLetterNotFound(f"no dead letter {dl_id}")
        found = dict(row)
        found["headers"] = json.loads(found["headers"])
        found["history"] = json.loads(found["history"])
        found["audit"] = [dict(r) for r in await self.store.pool.fetch(Q.audit_for, dl_id)]
        found["discard_means"] = discard_meaning(row)
        order_id = found["order_id"]
        found["parked_behind"] = await self.store.parked(order_id) if order_id else []
        found["blocks"] = await self.store.blocks(order_id) if order_id else []
        return found


def _now() -> datetime:
    return datetime.now(UTC)
