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
from saga_app.sim.messages import FakeDelivery
from saga_services.adapter import Adapter
from saga_services.sdk import Result, Service
from saga_shared.model.messages import ActionRequest
from saga_shared.transport.bus import Bus
from saga_shared.transport.delivery import Handler, InHand, deliver, deliver_batch

if TYPE_CHECKING:
    from saga_app.sim.world import World

PREFETCH, BATCH = 8, 8


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
        inbox: asyncio.Queue[FakeDelivery] = asyncio.Queue()
        queue = w.topology.action_queue(self.service.name)
        self.connection.consume(queue, inbox.put, prefetch=PREFETCH)
        self.tasks.append(asyncio.ensure_future(self._consume(inbox)))
        w.note(self.name, "started")

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

    async def _consume(self, inbox: asyncio.Queue[FakeDelivery]) -> None:
        self.in_hand = in_hand = InHand()
        while True:
            batch: list[AbstractIncomingMessage] = [await inbox.get()]
            await asyncio.sleep(0)  # what arrives together goes together
            while len(batch) < BATCH and not inbox.empty():
                batch.append(inbox.get_nowait())
            await self.thawed()
            for message in batch:
                in_hand.add(message)
            await deliver_batch(batch, self.adapter.handle_batch, in_hand, self._alone)

    def _alone(self, message: AbstractIncomingMessage, handler: Handler | None) -> None:
        work = deliver(message, handler or self.adapter.handle, settle_with=self.in_hand.settle)
        self.tasks.append(asyncio.ensure_future(work))
