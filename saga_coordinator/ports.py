"""The narrow interface the coordinator's logic works through: one transaction of the store.
Postgres (``store.Tx``) implements it, and so does the in-memory twin the test kit runs on
(``saga_coordinator.memory``); ``tests/twins/test_store_contract.py`` holds both to the
same behaviour. The bus's is ``saga_shared.transport.ports.Publisher``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Protocol

from saga_coordinator.convoy import OrderView
from saga_coordinator.register import SagaState
from saga_coordinator.rows import Claim, OutboxRow, Parked
from saga_coordinator.transition import Event
from saga_shared.model.messages import CommandReply, Envelope


class Transaction(Protocol):
    """Everything the processor does inside one transaction. Reads lock what they read
    (the order's row, the saga's) until the transaction ends; writes are applied at its end,
    all or none."""

    async def claim(self, messages: Sequence[Envelope]) -> list[Claim]:
        """Per message (one per order at most), in order: its inbox entry (``fresh`` False
        for a message seen before), its order (created on first sight), its saga."""

    async def lock_order(self, order_id: str) -> OrderView: ...

    def save_order(self, order: OrderView) -> None: ...

    async def block(self, order_id: str, message_id: str, state: str, reason: str) -> int:
        """Block the order by the message; its arrival number (kept when it blocks again)."""

    async def unblock(self, order_id: str, message_id: str) -> int | None:
        """Lift that block; its arrival number, None when there was none."""

    async def park(
        self, message: Envelope, seq: int | None, reason: str, arrival: int | None = None
    ) -> None:
        """Keep a message behind its order's block (once per message id), at ``arrival`` or
        at the next arrival number."""

    async def parked(self, order_id: str) -> list[Parked]:
        """The order's parked messages by arrival."""

    async def unpark(self, parked_id: int) -> None: ...

    async def replayed_sender(
        self, header: object, message_id: str, *, dead_too: bool = False
    ) -> tuple[bool, str | None]: ...

    def refusal(self, message: Envelope, rule: str, reason: str, sender: str | None) -> None: ...

    async def lock_saga(self, saga_id: str) -> SagaState | None: ...

    async def stored_reply(self, message_id: str) -> CommandReply | None:
        """The answer given to the command handled under ``message_id``, if any."""

    async def applied(self, message_id: str) -> bool:
        """Whether the inbox holds ``message_id``: a copy of that message was applied."""

    def remember_reply(self, message_id: str, reply: CommandReply) -> None:
        """The answer given to a command, kept for when it is sent again under its id."""

    async def next_waiting(self, order_id: str) -> SagaState | None:
        """The order's saga that has waited longest (status ``waiting``)."""

    async def waiting_for(self, order_id: str, saga_id: str) -> None:
        """The order's waiting sagas now wait for ``saga_id``."""

    def save_saga(self, state: SagaState, *, now: datetime) -> None: ...

    def log(self, message: Envelope, saga_id: str, note: str, seq: int | None) -> None: ...

    def arm_deadline(
        self, state: SagaState, step: int, phase: str, key: str, attempt: int, due_at: datetime
    ) -> None:
        """The saga's one deadline (replacing any): fire at ``due_at``."""

    def disarm_deadline(self, saga_id: str) -> None: ...

    def outbox(self, rows: Sequence[OutboxRow]) -> None:
        """Messages to publish once the transaction commits, in this order."""

    def count(self, events: Sequence[Event]) -> None:
        """Lifecycle events for the saga counters, counted once the transaction commits."""

    def on_commit(self, done: Callable[[], None]) -> None:
        """``done`` called once the transaction commits; not for a try that was rolled back
        and decided again (a decision's span is ended, so exported, once)."""

    async def flush(self) -> None: ...
