"""What replaying and discarding dead letters mean for their sagas: replay keeps the order's
publish order whichever ingester stored the letters; discard has one definite meaning per kind
of message, and a discarded request is never sent again behind the operator's back."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from aio_pika.abc import AbstractIncomingMessage

from saga_app.stack import Stack
from saga_coordinator.desk import DeadLetterDesk
from saga_coordinator.intake import Intake
from saga_coordinator.processor import Processor
from saga_services.adapter import Adapter, Incoming
from saga_services.faults import add_fault
from saga_shared.client import SagaClient
from saga_shared.config import Settings
from saga_shared.model.messages import AnyCommand, PartitionMessage
from saga_shared.security.trust import forwarded_id
from saga_shared.transport.bus import Bus
from saga_shared.transport.codec import peek
from tests.integration.helpers import (
    REFUND,
    eventually,
    publish_start,
    ran_one_after_another,
    remove_namespace,
    terminal,
)
from tests.integration.helpers import (
    quick as quick_catalog,
)

Predicate = Callable[[Any], bool]


class Breaker:
    """Makes chosen deliveries fail every time until told to stop: a bug in a handler of the
    intake, the coordinator or an adapter."""

    def __init__(self) -> None:
        self.breaks: list[tuple[str, Predicate]] = []

    def add(self, where: str, predicate: Predicate) -> None:
        self.breaks.append((where, predicate))

    def clear(self) -> None:
        self.breaks.clear()

    def check(self, where: str, item: Any) -> None:
        if any(w == where and p(item) for w, p in self.breaks):
            raise RuntimeError(f"simulated {where} bug")


@pytest.fixture
def breaker(monkeypatch: pytest.MonkeyPatch) -> Breaker:
    found = Breaker()
    forward, handle, adapt = Intake._forward, Processor._handle, Adapter._request

    async def broken_forward(self: Intake, command: AnyCommand, context: Any = None) -> None:
        assert command.sender is not None
        key = forwarded_id(command.sender.user, command.message_id)
        await self.store.assign_seq(key, command.order_id)  # numbered...
        found.check("intake", command)  # ...then it fails before it reaches the partition
        await forward(self, command, context)

    async def broken_handle(self: Processor, tx: Any, message: PartitionMessage, *a: Any) -> str:
        found.check("coordinator", message)
        return await handle(self, tx, message, *a)

    def broken_adapt(self: Adapter, delivery: AbstractIncomingMessage) -> Incoming:
        # Every request goes through here, alone or in a batch.
        found.check("adapter", peek(delivery.body) | {"body": delivery.body})
        return adapt(self, delivery)

    monkeypatch.setattr(Intake, "_forward", broken_forward)
    monkeypatch.setattr(Processor, "_handle", broken_handle)
    monkeypatch.setattr(Adapter, "_request", broken_adapt)
    return found


@pytest.fixture
def quick(settings: Settings, tmp_path: Path) -> Settings:
    return quick_catalog(settings, tmp_path)


async def stacks(settings: Settings, coordinators: int) -> list[Stack]:
    shares = [f"{k}/{coordinators}" for k in range(coordinators)]
    running = [Stack(settings.with_(coordinator_share=s), ["coordinator"]) for s in shares]
    running.append(Stack(settings, ["inventory", "erp", "payments", "email"]))
    for stack in running:
        await stack.start()
    return running


@pytest.fixture
async def running(
    request: pytest.FixtureRequest, quick: Settings, breaker: Breaker
) -> AsyncIterator[list[Stack]]:
    """The stacks, started after the breaker is in place (consumers bind their handler)."""
    started = await stacks(quick, getattr(request, "param", 1))
    try:
        yield started
    finally:
        for stack in reversed(started):
            await stack.stop()
        await remove_namespace(quick)


async def letters(pool: asyncpg.Pool, order_id: str) -> list[dict[str, Any]]:
    rows = await pool.fetch("SELECT * FROM dead_letters WHERE order_id = $1 ORDER BY id", order_id)
    return [dict(r) for r in rows]


def desk_of(stack: Stack) -> DeadLetterDesk:
    return DeadLetterDesk(stack.store, Processor(stack.catalog, stack.bus.topology))


@pytest.mark.parametrize("running", [1, 2], indirect=True, ids=["one-ingester", "two-ingesters"])
async def test_replaying_an_order_keeps_its_publish_order(
    running: list[Stack], quick: Settings, breaker: Breaker, pool: asyncpg.Pool, order_id: str
) -> None:
    """Two starts die at the intake after they were numbered, a third is parked behind them;
    replaying the order runs them in the order they were sent, whichever process stored what."""
    doomed = {f"{order_id}-b1", f"{order_id}-b2"}
    breaker.add("intake", lambda m: m.saga_id in doomed)
    async with Bus(quick) as bus:
        b1 = await publish_start(bus, order_id, f"{order_id}-b1")
        b2 = await publish_start(bus, order_id, f"{order_id}-b2")
        parked = await publish_start(bus, order_id, f"{order_id}-p")
    dead = await eventually(lambda: letters(pool, order_id), lambda rows: len(rows) == 2)
    assert {d["reason"] for d in dead} == {"delivery_limit"} and all(
        d["blocks_order"] for d in dead
    )
    coordinator = running[0]
    await eventually(lambda: coordinator.store.parked(order_id), lambda rows: len(rows) >= 1)
    breaker.clear()

    for dl_id in await desk_of(coordinator).ids(order_id):
        assert (await desk_of(coordinator).replay(dl_id, "ops")).done

    first, second, third = [await terminal(coordinator, s) for s in (b1, b2, parked)]
    assert [s.status for s in (first, second, third)] == ["completed"] * 3
    assert ran_one_after_another(first, second)
    assert ran_one_after_another(second, third)
    # This order only: the database is shared with the other tests, whose blocks are theirs.
    assert order_id not in [r["order_id"] for r in await coordinator.store.blocked_orders()]


async def test_discarding_a_dead_request_fails_its_step_and_it_is_never_sent_again(
    running: list[Stack], quick: Settings, breaker: Breaker, pool: asyncpg.Pool, order_id: str
) -> None:
    breaker.add("adapter", lambda d: b"email.send" in d["body"])
    async with Bus(quick) as bus, SagaClient(bus) as client:
        saga_id = await client.start("refund", order_id=order_id, params=REFUND)
        [dead] = await eventually(lambda: letters(pool, order_id), lambda rows: len(rows) == 1)
        assert dead["message_type"] == "action.request"
        desk = desk_of(running[0])
        assert "never sent again" in (await desk.get(dead["id"]))["discard_means"]
        breaker.clear()  # the e-mail system works again: nothing may send it now

        result = await desk.discard(dead["id"], "ops", "the customer was told by phone")
        assert result.done
        state = await terminal(running[0], saga_id)

    assert state.status == "compensated"
    email = state.steps[2]
    # Discarded, its effect was unknown: an irreversible step is settled first, and its
    # service fenced the key nobody had claimed (the request never reached a call).
    assert (email.status, email.settled) == ("failed", "did_not_happen")
    assert "discarded by ops" in (email.error or "")
    assert [s.status for s in state.steps[:2]] == ["compensated", "compensated"]
    assert await pool.fetchval("SELECT count(*) FROM deadlines WHERE saga_id = $1", saga_id) == 0
    sent = await pool.fetchval(
        "SELECT count(*) FROM sim_email_messages WHERE order_id = $1", order_id
    )
    assert sent == 0


async def test_discarding_a_dead_compensation_request_stops_the_saga_for_a_person(
    running: list[Stack], quick: Settings, breaker: Breaker, pool: asyncpg.Pool, order_id: str
) -> None:
    await add_fault(pool, "erp.create_credit_note", order_id, "permanent")
    breaker.add("adapter", lambda d: b"release_stock" in d["body"])
    async with Bus(quick) as bus, SagaClient(bus) as client:
        saga_id = await client.start("refund", order_id=order_id, params=REFUND)
        [dead] = await eventually(lambda: letters(pool, order_id), lambda rows: len(rows) == 1)
        breaker.clear()
        await desk_of(running[0]).discard(dead["id"], "ops", "released in the warehouse")
        state = await terminal(running[0], saga_id)

    assert state.status == "needs_human"
    assert state.steps[0].compensation_status == "failed"
    assert "discarded by ops" in (state.needs_human_reason or "")


async def test_discarding_a_dead_outcome_is_as_if_it_was_lost(
    running: list[Stack], quick: Settings, breaker: Breaker, pool: asyncpg.Pool, order_id: str
) -> None:
    breaker.add("coordinator", lambda m: m.type == "action.done" and m.step == 1 and m.attempt == 1)
    async with Bus(quick) as bus, SagaClient(bus) as client:
        saga_id = await client.start("refund", order_id=order_id, params=REFUND)
        [dead] = await eventually(lambda: letters(pool, order_id), lambda rows: len(rows) == 1)
        assert dead["message_type"] == "action.done"
        result = await desk_of(running[0]).discard(dead["id"], "ops", "lost in transit")
        assert "as if the outcome was lost" in result.detail
        state = await terminal(running[0], saga_id)

    assert state.status == "completed"
    assert state.steps[1].sends == 2  # the deadline asked again, under the same key
    notes = await pool.fetchval(
        "SELECT count(*) FROM sim_erp_credit_notes WHERE order_id = $1", order_id
    )
    assert notes == 1
