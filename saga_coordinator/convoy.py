"""The convoy rules per order, pure: apply a message now, park it, or drop it as stale.

Two guards keep one order's messages in publish order even when the broker cannot: a *block*
(a message of the order failed, or was dead-lettered: later ones wait behind it) and the intake's
per-order command numbers (a command that arrives ahead of a gap waits for the missing one).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Literal

from saga_coordinator.register import HOLDS_ORDER, TERMINAL
from saga_shared.model.messages import PartitionMessage

# A parked placeholder for a discarded command that will never arrive: the drain skips its number.
SKIP = "convoy.skip"


@dataclass(frozen=True)
class Block:
    message_id: str
    state: str  # retrying | dead | replaying


@dataclass(frozen=True)
class OrderView:
    order_id: str
    active_saga_id: str | None
    next_seq: int
    handled: int
    blocks: tuple[Block, ...] = ()
    has_parked: bool = False  # as read under the lock; parking sets it, draining may clear it
    # Sagas queue behind the active one, as read under the lock; a saga that starts waiting
    # sets it. Unknown counts as yes: the hand-over then looks.
    has_waiting: bool = True


class Verdict(StrEnum):
    APPLY = "apply"
    PARK = "park"
    STALE = "stale"


@dataclass(frozen=True)
class Admission:
    verdict: Verdict
    reason: str = ""


def command_seq(message: PartitionMessage) -> int | None:
    return None if message.type.startswith("action.") else getattr(message, "seq", None)


def blocked_by(order: OrderView, message_id: str) -> bool:
    return any(b.message_id == message_id for b in order.blocks)


def admit(order: OrderView, message_id: str, seq: int | None) -> Admission:
    mine = blocked_by(order, message_id)
    others = [b for b in order.blocks if b.message_id != message_id]
    if others and not mine:
        first = others[0]
        return Admission(
            Verdict.PARK, f"order blocked by message {first.message_id} ({first.state})"
        )
    if seq is not None:
        if seq < order.next_seq:
            return Admission(Verdict.STALE, f"command {seq} already handled")
        if seq > order.next_seq:
            return Admission(Verdict.PARK, f"command {seq} waits for command {order.next_seq}")
    return Admission(Verdict.APPLY)


def after_apply(order: OrderView, seq: int | None) -> OrderView:
    """The order once a message was applied: one more handled, and the next command expected."""
    next_seq = order.next_seq + 1 if seq is not None and seq == order.next_seq else order.next_seq
    return replace(order, next_seq=next_seq, handled=order.handled + 1)


def without_block(order: OrderView, message_id: str) -> OrderView:
    return replace(order, blocks=tuple(b for b in order.blocks if b.message_id != message_id))


def with_active(order: OrderView, saga_id: str | None) -> OrderView:
    return replace(order, active_saga_id=saga_id)


def skip_seq(order: OrderView) -> OrderView:
    return replace(order, next_seq=order.next_seq + 1)


# Rule 6 (one active saga per order), decided here alone: who holds the order when a message
# is decided (``held_by``: a new saga waits behind it), and what a saga's new status does to
# its order. "take": it becomes the order's active saga; "pass": it ended, so the oldest waiting
# saga (if any) starts and takes the order; "keep": nothing changes (needs_human keeps the
# order held).
HandOver = Literal["take", "pass", "keep"]


def held_by(order: OrderView, saga_id: str) -> str | None:
    """The saga that holds the order for a message of ``saga_id``: none when it is its own."""
    return order.active_saga_id if order.active_saga_id != saga_id else None


def after_decision(order: OrderView, status: str | None) -> OrderView:
    """A saga decided into ``waiting`` queues behind the holder: the order has one waiting."""
    return replace(order, has_waiting=True) if status == "waiting" else order


def hand_over(order: OrderView, saga_id: str, status: str) -> HandOver:
    if status in HOLDS_ORDER and order.active_saga_id is None:
        return "take"
    if saga_id == order.active_saga_id and status in TERMINAL:
        return "pass"
    return "keep"
