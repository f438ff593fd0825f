"""Bad input gets a clear error and loses nothing: no crash, no silent drop."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aio_pika
import asyncpg
import pytest

from saga_coordinator.app import Stack
from shared.bus import Bus
from shared.client import CommandRejected, SagaClient
from shared.config import Settings
from tests.integration.helpers import eventually
from tests.integration.test_sagas import REFUND, run_saga


async def _rejections(pool: asyncpg.Pool, message_id: str | None = None) -> list[dict[str, Any]]:
    rows = await pool.fetch("SELECT * FROM rejections ORDER BY id")
    return [dict(r) for r in rows if message_id is None or r["message_id"] == message_id]


async def _wait_for(pool: asyncpg.Pool, message_id: str) -> dict[str, Any]:
    for _ in range(100):
        row = await pool.fetchrow("SELECT * FROM rejections WHERE message_id = $1", message_id)
        if row is not None:
            return dict(row)
        await asyncio.sleep(0.1)
    raise AssertionError(f"no rejection recorded for {message_id}")


async def test_garbage_commands_are_recorded_and_the_stack_carries_on(
    stack: Stack, client: SagaClient, settings: Settings, pool: asyncpg.Pool, order_id: str
) -> None:
    garbage = {
        b"not json at all": "not JSON",
        b"\xff\xfe\x00bad utf-8": "UTF-8",
        b"[1, 2, 3]": "JSON object",
        b"x" * (settings.max_message_bytes + 1): "over the limit",
    }
    async with Bus(settings) as bus:
        for i, body in enumerate(garbage):
            # Only the AMQP message-id names these: the rejection is recorded under it.
            message = aio_pika.Message(body, message_id=f"garbage-{order_id}-{i}")
            await bus.publish_raw(bus.topology.commands_exchange, "saga.start", message)
        for i, (body, words) in enumerate(garbage.items()):
            row = await _wait_for(pool, f"garbage-{order_id}-{i}")
            assert row["rule"] == "invalid_message"
            assert words in row["reason"]
            assert row["transport_id"] == f"garbage-{order_id}-{i}"
            assert row["sender"] == bus.user
            # an oversized body keeps its first bytes and its real size
            assert row["body"] == body[: settings.max_message_bytes]
            assert row["body_bytes"] == len(body)

    state = await run_saga(client, stack, "refund", order_id, REFUND)
    assert state.status == "completed"


async def test_schema_invalid_command_gets_a_reply_naming_the_field(
    stack: Stack, settings: Settings, pool: asyncpg.Pool, order_id: str
) -> None:
    async with Bus(settings) as bus:
        channel = await bus.connection.channel()
        replies = await channel.declare_queue(exclusive=True, auto_delete=True)
        command = {
            "message_id": "m-bad-1",
            "type": "saga.start",
            "saga_id": "s-bad-1",
            "order_id": order_id,
            "saga": "refund",
            "params": REFUND,
            "reply_to": replies.name,
            "colour": "blue",
        }
        await bus.publish_raw(
            bus.topology.commands_exchange,
            "saga.start",
            aio_pika.Message(json.dumps(command).encode()),
        )
        async with replies.iterator(timeout=20) as incoming:
            async for message in incoming:
                reply = json.loads(message.body)
                await message.ack()
                break
        await channel.close()

    assert reply["type"] == "command.rejected"
    assert reply["command_id"] == "m-bad-1"
    assert "colour" in reply["reason"]
    assert [r["rule"] for r in await _rejections(pool, "m-bad-1")] == ["invalid_message"]
    assert await stack.store.get("s-bad-1") is None


async def test_a_command_the_coordinator_refuses_is_recorded_with_the_gateways_rejections(
    stack: Stack, client: SagaClient, pool: asyncpg.Pool, order_id: str
) -> None:
    with pytest.raises(CommandRejected, match="no saga s-nobody"):
        await client.abort("s-nobody", order_id=order_id, reason="never started")

    [row] = await eventually(
        lambda: pool.fetch("SELECT * FROM rejections WHERE saga_id = 's-nobody'"),
        lambda rows: len(rows) == 1,
    )
    assert (row["rule"], row["command_type"], row["sender"]) == (
        "no_saga", "saga.abort", client.bus.user,
    )  # fmt: skip
    history = await pool.fetch("SELECT note FROM saga_log WHERE saga_id = 's-nobody'")
    assert [h["note"] for h in history] == ["no saga s-nobody"]
