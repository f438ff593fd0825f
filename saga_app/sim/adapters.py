"""An adapter process in the simulation: the product's adapter framework (``saga_services.adapter``:
claims, retries, settles, batches, outcomes) around a service's functions, over the simulated
broker, the services' key records in memory and the systems in memory. Deliveries that arrive
together go as one batch (``handle_batch``), as the real consumer hands them; what a batch
sends back alone runs in a task of its own. A frozen process (SIGSTOP) takes no delivery, makes
no call and publishes nothing until it is thawed; its leases run out meanwhile."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, cast

from aio_pika.abc import AbstractIncomingMessage

from saga_app.sim.bus import SimBus
from saga_app.sim.errors import ChannelGone, NotFound
from saga_app.sim.messages import FakeDelivery
from saga_services.adapter import Adapter
from saga_services.sdk import Result, Service
from saga_shared.model.messages import ActionRequest
from saga_shared.transport.bus import Bus
from saga_shared.transport.delivery import Handler, InHand, deliver, deliver_batch
from saga_shared.transport.poison import Poison

if TYPE_CHECKING:
    from saga_app.sim.world import World

PREFETCH, BATCH, WATCHDOG_S = 8, 8, 1.0


class Watched(Service[Any]):
    """A service whose calls the world counts (per key and send: the catalog's attempts bound
    them) and a freeze holds."""

    def __init__(self, inner: Service[Any], process: AdapterProcess) -> None:
        super().__init__(inner.name, status=inner.status, atomic=inner.atomic)
        self._handlers = inner._handlers
        self._setup = inner._setup
        self._inner = inner
        self._process = process

    async def call(self, req: ActionRequest, deps: Any, *, attempt: int = 1) -> Result:
        process, world = self._process, self._process.world
        await process.thawed()
        await world.crash_point(process, "adapter.before_call")
        world.called(process.name, req, attempt)
        result = await self._inner.call(req, deps, attempt=attempt)
        await world.crash_point(process, "adapter.after_call")
        return result


class AdapterProcess:
    def __init__(self, world: World, service: Service[Any], index: int) -> None:
        self.world = world
        self.service = service
        self.index = index
        self.name = f"{service.name}-{index}"
        self.tasks: list[asyncio.Task[Any]] = []
        self.alive = False
        self.lives = 0
        self._thaw = asyncio.Event()
        self._thaw.set()

    async def start(self) -> None:
        w = self.world
        self.lives += 1
        self.connection = w.broker.connect(user=w.users.service(self.service.name),
                                           name=f"{self.name}#{self.lives}")  # fmt: skip
        bus = SimBus(self.connection, w.topology, w.settings, before=self.thawed)
        self.adapter = Adapter(
            Watched(self.service, self), w.settings, w.catalog, cast(Bus, bus), None,
            keys=w.keys[self.service.name], owner=f"{self.name}#{self.lives}", memory=w.systems,
            clock=lambda: asyncio.get_running_loop().time(),
        )  # fmt: skip
        await self.adapter.open()
        self.alive = True
        t, name = w.topology, self.service.name
        # The request queue's deliveries are counted and buried here (the real adapter's
        # saga_shared.transport.poison), by a counter that outlives the process, as the table does.
        poison = Poison(t.request_queue(name), w.settings.delivery_limit, w.delivery_counts,
                        bus.publish_raw, t.dead_letter_exchange)  # fmt: skip
        for queue, guard in ((t.action_queue(name), None), (t.request_queue(name), poison)):
            self.tasks.append(asyncio.ensure_future(self._subscribed(queue, guard)))
        w.note(self.name, "started")

    async def _subscribed(self, queue: str, poison: Poison | None) -> None:
        """Subscribe, and again whenever the broker cancels the consumer (its queue deleted)
        or the queue is not there yet: the real consumer's watchdog (``consume``)."""
        while True:
            inbox: asyncio.Queue[FakeDelivery] = asyncio.Queue()
            try:
                consumer = self.connection.consume(queue, inbox.put, prefetch=PREFETCH)
            except NotFound:
                await asyncio.sleep(WATCHDOG_S)
                continue
            work = asyncio.ensure_future(self._consume(inbox, poison))
            try:
                # polled, as the real watchdog polls: a cancel tells the consumer nothing
                while not consumer.closed:  # noqa: ASYNC110
                    await asyncio.sleep(WATCHDOG_S)
            finally:
                work.cancel()

    def stop(self, why: str) -> None:
        if not self.alive:
            return
        self.alive = False
        for task in self.tasks:
            task.cancel()
        self.tasks = []
        self.connection.close(why)
        self._thaw.set()
        self.world.note(self.name, why)

    def freeze(self) -> None:
        self._thaw.clear()
        self.world.note(self.name, "frozen")

    def thaw(self) -> None:
        self._thaw.set()
        self.world.note(self.name, "thawed")

    async def thawed(self) -> None:
        await self._thaw.wait()

    async def _consume(self, inbox: asyncio.Queue[FakeDelivery], poison: Poison | None) -> None:
        in_hand = InHand(poison.bury if poison is not None else None)
        handle = self.adapter.handle_batch
        screened = poison.screen_batch(handle) if poison is not None else handle

        def alone(message: AbstractIncomingMessage, handler: Handler | None) -> None:
            work = deliver(message, handler or self.adapter.handle, settle_with=in_hand.settle)
            task = asyncio.ensure_future(work)
            task.add_done_callback(self._unsettled)
            self.tasks.append(task)

        while True:
            batch: list[AbstractIncomingMessage] = [await inbox.get()]
            await asyncio.sleep(0)  # what arrives together goes together
            while len(batch) < BATCH and not inbox.empty():
                batch.append(inbox.get_nowait())
            await self.thawed()
            for message in batch:
                in_hand.add(message)
            await deliver_batch(batch, screened, in_hand, alone)

    def _unsettled(self, task: asyncio.Future[Any]) -> None:
        """A delivery whose consumer the broker cancelled meanwhile (its queue deleted) cannot
        be settled, as the real consumer's ``_unsettled`` takes it; any other failure is the
        broker's record of a callback that raised."""
        if task.cancelled() or isinstance(task.exception(), ChannelGone | type(None)):
            return
        self.world.broker.callback_done(task)
