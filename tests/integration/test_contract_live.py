"""The exported schemas validate the real messages of a run, captured off the broker."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import asyncpg
import jsonschema
from aio_pika.abc import AbstractIncomingMessage

from saga_app.stack import Stack
from saga_services.faults import add_fault
from saga_shared.client import SagaClient
from saga_shared.transport.contract import ADAPTER, COMMANDS
from tests.integration.helpers import REFUND, terminal
from tests.integration.test_gates_and_abort import CHECKOUT, at_gate

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"


def schema_for(message_type: str) -> str:
    if message_type in COMMANDS or message_type in ADAPTER:
        return f"{message_type}.json"
    if message_type.startswith("command."):
        return "command.reply.json"
    return "saga.event.json"


async def test_captured_messages_validate_against_the_exported_schemas(
    stack: Stack, client: SagaClient, pool: asyncpg.Pool, order_id: str
) -> None:
    captured: list[dict[str, Any]] = []
    channel = await stack.bus.connection.channel()
    tap = await channel.declare_queue(exclusive=True, auto_delete=True)
    t = stack.bus.topology
    await tap.bind(t.commands_exchange, routing_key="#")
    await tap.bind(t.events_exchange, routing_key="#")
    for service in t.services:
        await tap.bind(t.actions_exchange, routing_key=service)
        await tap.bind(t.actions_exchange, routing_key=t.request_key(service))
    for index in range(t.partitions):
        await tap.bind(t.partitions_exchange, routing_key=str(index))
        await tap.bind(t.outcomes_exchange, routing_key=str(index))

    async def keep(message: AbstractIncomingMessage) -> None:
        captured.append(json.loads(message.body))

    await tap.consume(keep, no_ack=True)

    done = await client.start("refund", order_id=order_id, params=REFUND)
    await terminal(stack, done)
    await add_fault(pool, "erp.create_credit_note", f"{order_id}-b", "permanent")
    failed = await client.start("refund", order_id=f"{order_id}-b", params=REFUND)
    await terminal(stack, failed)
    gated = await client.start("checkout_approved", order_id=f"{order_id}-c", params=CHECKOUT)
    await at_gate(client, gated)
    await client.approve(gated, order_id=f"{order_id}-c")
    await client.status(gated, order_id=f"{order_id}-c")
    await terminal(stack, gated)
    await channel.close()

    kinds = {m["type"] for m in captured}
    assert {"saga.start", "action.request", "action.done", "action.failed", "saga.approve",
            "saga.completed", "saga.compensated", "saga.awaiting_approval"} <= kinds  # fmt: skip
    for message in captured:
        schema = json.loads((SCHEMAS / schema_for(message["type"])).read_text())
        jsonschema.validate(message, schema)
