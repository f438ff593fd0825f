"""The intake: the commands that do not go straight to an order's partition. Desk commands
(``dlq.replay``, ``dlq.discard``) are performed here, at once; a saga command published under its
bare type (``saga.start``, by a client that does not name the partition) is checked by the
same gatekeeper, numbered in its order's arrival order and forwarded to the partition.
"""

from __future__ import annotations

from aio_pika.abc import AbstractIncomingMessage

from saga_coordinator.desk import DeadLetterDesk
from saga_coordinator.gatekeeper import Gatekeeper, stamped
from saga_coordinator.store import Store
from saga_shared.config import Settings
from saga_shared.model.catalog import Catalog
from saga_shared.model.messages import AnyCommand, DeskCommand, QuerySaga
from saga_shared.observability import tracing
from saga_shared.transport.bus import Bus
from saga_shared.transport.failures import failure_recorder
from saga_shared.transport.patience import publish_in_hand


class Intake:
    def __init__(
        self,
        settings: Settings,
        catalog: Catalog,
        bus: Bus,
        store: Store,
        desk: DeadLetterDesk | None = None,
    ) -> None:
        self.settings = settings
        self.bus = bus
        self.store = store
        self.desk = desk
        self.gate = Gatekeeper(settings, catalog, bus, store)

    async def handle(self, delivery: AbstractIncomingMessage) -> None:
        examined = await self.gate.examine(delivery)
        if examined is None:
            return  # refused: recorded and answered
        command, _ = examined  # the partition checks a start's plan again, in the saga's order
        if isinstance(command, QuerySaga):
            await self.gate.answer(command)
        elif isinstance(command, DeskCommand):
            assert self.desk is not None, "desk commands need the desk"
            await self.gate.publish_reply(command.reply_to, await self.desk.perform(command))
        else:
            await self._forward(command, delivery)

    async def _forward(self, command: AnyCommand, delivery: AbstractIncomingMessage) -> None:
        """Numbered first, so a command that fails later keeps its place in its order; then sent
        to the partition under the gatekeeper's id for it (a re-sent or redelivered command gets
        the same id and number, and the inbox absorbs it)."""
        forwarded = stamped(command)
        seq = await self.store.assign_seq(forwarded.message_id, command.order_id)
        with tracing.current(
            f"intake {command.type}", context=tracing.extract(delivery.headers),
            kind=tracing.SpanKind.CONSUMER,
            attributes=lambda: tracing.attributes(command.saga_id, command.order_id),
        ):  # fmt: skip
            numbered = forwarded.model_copy(update={"seq": seq})
            item = self.bus.for_partition(numbered, tracing.headers_of())
            [error] = await publish_in_hand(self.bus, [item], [delivery])
            if error is not None:
                raise error

    async def run(self) -> None:
        queue = self.bus.topology.intake_queue
        await self.bus.consume(
            queue,
            self.handle,
            # One command in hand at a time: a command that fails goes back to the head of the
            # queue and is numbered before the ones behind it, so the order's commands keep the
            # order they arrived in. (Blocking the order instead would deadlock with the
            # numbering: the blocked command could wait for a number given to a later one.)
            prefetch=1,
            mode="sequential",
            on_failure=failure_recorder(self.store.pool, queue, block_order=False),
        )
