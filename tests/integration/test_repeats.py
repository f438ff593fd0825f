"""Every command gets an answer, however often it is sent (design rule 12): a start, an abort and
an approval each sent three times under one message id and three times under new ones, with the
stack running and while it is down, through the client an agent uses. Each has one effect."""

from __future__ import annotations

import asyncpg
import pytest
from pydantic import JsonValue

from saga_app.stack import Stack
from saga_coordinator.register import SagaState
from saga_shared.client import NotAnswered, SagaClient
from saga_shared.config import Settings
from saga_shared.model.messages import CommandReply
from saga_shared.transport.bus import Bus
from tests.integration.helpers import REFUND, eventually, remove_namespace

CHECKOUT: dict[str, JsonValue] = {
    "sku": "SKU-2", "quantity": 1, "amount_cents": 2500, "card_token": "tok_visa",
    "customer_email": "di@example.com", "address": "1 Main Street",
}  # fmt: skip


async def answers(client: SagaClient, send: object, ids: list[str]) -> list[CommandReply]:
    """The same command once per message id given, each answered."""
    got = []
    for message_id in ids:
        await send(message_id)  # type: ignore[operator]
        assert client.last_reply is not None
        got.append(client.last_reply)
    return got


async def at(stack: Stack, saga_id: str, status: str) -> SagaState:
    found = await eventually(lambda: stack.store.get(saga_id),
                             lambda s: s is not None and s.status == status)  # fmt: skip
    assert found is not None
    return found


async def reservations(pool: asyncpg.Pool, order_id: str) -> int:
    query = "SELECT count(*) FROM sim_inventory_reservations WHERE order_id = $1"
    return int(await pool.fetchval(query, order_id))


async def test_a_start_an_abort_and_an_approval_sent_six_times_act_once(
    stack: Stack, settings: Settings, pool: asyncpg.Pool, order_id: str
) -> None:
    saga_id = f"s-{order_id}"
    async with Bus(settings) as bus, SagaClient(bus, answer_within_s=20) as client:

        async def start(message_id: str) -> None:
            await client.start("checkout_approved", order_id=order_id, saga_id=saga_id,
                               params=CHECKOUT, message_id=message_id)  # fmt: skip

        got = await answers(client, start, ["m-1", "m-1", "m-1", "m-2", "m-3", "m-4"])
        assert {a.type for a in got} == {"command.accepted"}
        assert [a.reason.startswith("already started") for a in got[3:]] == [True] * 3
        await at(stack, saga_id, "awaiting_approval")

        async def approve(message_id: str) -> None:
            await client.approve(saga_id, order_id=order_id, note="checked", step=3,
                                 message_id=message_id)  # fmt: skip

        got = await answers(client, approve, ["a-1", "a-1", "a-1", "a-2", "a-3", "a-4"])
        assert {a.type for a in got} == {"command.accepted"}
        assert all("already approved" in a.reason for a in got[3:])
        state = await at(stack, saga_id, "completed")
        assert [d.kind for d in state.decisions] == ["approve"]
        assert await reservations(pool, order_id) == 1


async def test_an_abort_sent_six_times_aborts_once(
    stack: Stack, settings: Settings, order_id: str
) -> None:
    saga_id = f"s-{order_id}"
    async with Bus(settings) as bus, SagaClient(bus, answer_within_s=20) as client:
        await client.start("checkout_approved", order_id=order_id, saga_id=saga_id,
                           params=CHECKOUT)  # fmt: skip
        await at(stack, saga_id, "awaiting_approval")

        async def abort(message_id: str) -> None:
            await client.abort(saga_id, order_id=order_id, reason="changed my mind",
                               message_id=message_id)  # fmt: skip

        got = await answers(client, abort, ["x-1", "x-1", "x-1", "x-2", "x-3", "x-4"])
        assert {a.type for a in got} == {"command.accepted"}
        assert all("already aborted" in a.reason for a in got[3:])
        state = await at(stack, saga_id, "compensated")
        assert [d.kind for d in state.decisions] == ["abort"]


async def test_starts_sent_while_the_stack_is_down_are_answered_when_it_is_back(
    settings: Settings, pool: asyncpg.Pool, order_id: str
) -> None:
    """Sent three times under one id with no coordinator: each send is queued and says so
    (never silently); once the stack is back, sending it again is answered, and it ran once."""
    saga_id = f"s-{order_id}"
    try:
        async with Bus(settings) as bus:
            await bus.declare()  # the broker holds the command; no coordinator runs
            async with SagaClient(bus, answer_within_s=1.5) as client:
                for _ in range(3):
                    with pytest.raises(NotAnswered) as unanswered:
                        await client.start("refund", order_id=order_id, saga_id=saga_id,
                                           params=REFUND, message_id="m-down")  # fmt: skip
                    assert unanswered.value.queued
            async with Stack(settings) as stack, SagaClient(bus, answer_within_s=20) as client:
                await client.start("refund", order_id=order_id, saga_id=saga_id, params=REFUND,
                                   message_id="m-down")  # fmt: skip
                reply = client.last_reply
                assert reply is not None and reply.type == "command.accepted"
                await at(stack, saga_id, "completed")
        assert await reservations(pool, order_id) == 1
    finally:
        await remove_namespace(settings)
