"""The agents' side of a benchmark run: publish sagas as agents would, ``concurrency`` in
flight, and time each from its publish to its final lifecycle event."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from typing import Literal

import asyncpg
from aio_pika.abc import AbstractIncomingMessage
from pydantic import BaseModel, JsonValue, TypeAdapter

from saga_services.faults import add_fault
from saga_shared.config import Settings
from saga_shared.model.messages import StartSaga
from saga_shared.security.identity import Directory
from saga_shared.transport.bus import Bus

Mix = Literal["mixed", "refund"]
MIXES: tuple[Mix, ...] = ("mixed", "refund")
FINAL = ("saga.completed", "saga.compensated", "saga.needs_human")


class _Final(BaseModel):
    """What the load reads of a final event."""

    saga_id: str
    type: str


_FINAL_EVENT: TypeAdapter[_Final] = TypeAdapter(_Final)
PARAMS: dict[str, JsonValue] = {
    "sku": "SKU-1", "quantity": 1, "amount_cents": 4999, "customer_email": "a@example.com",
    "card_token": "tok_1", "address": "1 Main Street",
}  # fmt: skip
REFUND_KEYS = ("sku", "quantity", "amount_cents", "customer_email")


@dataclass
class Load:
    seconds: float
    latencies_ms: list[float]
    outcomes: dict[str, int]
    events: int


def command(run: str, i: int, mix: Mix) -> StartSaga:
    """Saga ``i`` of a run. One in ten fails and compensates: in the mixed load a checkout
    whose address check refuses the depot; in the refund load a credit note the ERP refuses
    (a fault injected beforehand, see ``inject_faults``)."""
    params = dict(PARAMS)
    saga = "refund" if mix == "refund" or i % 2 else "checkout"
    if mix == "mixed" and i % 10 == 0:
        saga, params["address"] = "checkout", "Closed depot"
    if saga == "refund":
        params = {k: params[k] for k in REFUND_KEYS}
    return StartSaga(saga_id=f"b{run}-{i}", order_id=f"bo{run}-{i}", saga=saga, params=params)


async def inject_faults(database_url: str, run: str, sagas: int, mix: Mix) -> None:
    if mix != "refund":
        return
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    try:
        for i in range(0, sagas, 10):
            await add_fault(pool, "erp.create_credit_note", f"bo{run}-{i}", "permanent")
    finally:
        await pool.close()


async def run_load(settings: Settings, run: str, sagas: int, concurrency: int, mix: Mix) -> Load:
    # In roles identity, as the agent's account: it may not declare the events exchange, only
    # listen on a queue of its own.
    agent = Directory.from_settings(settings).agent_user if settings.identity == "roles" else None
    async with Bus(settings, user=agent) as bus:
        channel = await bus.connection.channel()
        exchange = await channel.get_exchange(bus.topology.events_exchange, ensure=False)
        queue = await channel.declare_queue(exclusive=True, auto_delete=True)
        # An agent waiting for its sagas' outcomes hears only the final events: the others
        # (saga.started, ...) are routed to nobody, as when no service listens for them.
        for key in FINAL:
            await queue.bind(exchange, routing_key=key)
        waiting: dict[str, asyncio.Future[str]] = {}
        events = 0

        async def on_event(message: AbstractIncomingMessage) -> None:
            nonlocal events
            events += 1
            # The saga and the kind only: the register the event carries is not this load's
            # to check (the client library's waiting agents do), and parsing it would take
            # CPU from the stack on this machine.
            event = _FINAL_EVENT.validate_json(message.body)
            future = waiting.get(event.saga_id)
            if event.type in FINAL and future is not None and not future.done():
                future.set_result(event.type)

        await queue.consume(on_event, no_ack=True)
        window = asyncio.Semaphore(concurrency)
        latencies: list[float] = []
        outcomes: dict[str, int] = {}

        async def one(i: int) -> None:
            async with window:
                start = command(run, i, mix)
                waiting[start.saga_id] = asyncio.get_running_loop().create_future()
                began = time.perf_counter()
                # Routed straight to the order's partition, as the client library does.
                key = bus.topology.command_key(start.type, start.order_id)
                await bus.publish(bus.topology.commands_exchange, key, start)
                outcome = await asyncio.wait_for(waiting[start.saga_id], 300)
                latencies.append((time.perf_counter() - began) * 1000)
                outcomes[outcome] = outcomes.get(outcome, 0) + 1

        started = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(sagas)))
        elapsed = time.perf_counter() - started
        await channel.close()
        return Load(elapsed, latencies, outcomes, events)


def new_run_id() -> str:
    return uuid.uuid4().hex[:6]
