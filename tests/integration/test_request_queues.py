"""Action requests travel as transient messages through a classic, non-durable queue per
service, against the real RabbitMQ: the register remembers them and sends them again, so losing
the queue costs a resend, never a saga; the adapter counts their deliveries and buries what it
gives up on, since a classic queue does neither (docs/explanation/design.md, "Two kinds of
queue")."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aio_pika
import asyncpg

from saga_app.stack import Stack
from saga_shared.client import SagaClient
from saga_shared.config import Settings
from saga_shared.model.messages import ActionRequest
from saga_shared.transport.bus import Bus, QueueDepth
from tests.integration.deployment import Deployment
from tests.integration.helpers import (
    REFUND,
    eventually,
    publish_start,
    quick,
    remove_namespace,
    terminal,
)
from tests.integration.test_roles import dead_letters, publish_unsigned


def broker_queues(namespace: str) -> dict[str, dict[str, Any]]:
    """The namespace's queues as the broker lists them."""
    command = ("rabbitmqctl", "-q", "list_queues", "name", "type", "durable", "--formatter", "json")
    done = subprocess.run(command, check=True, capture_output=True, timeout=60, text=True)
    return {q["name"]: q for q in json.loads(done.stdout) if q["name"].startswith(namespace + ".")}


async def test_requests_go_through_classic_transient_queues_and_the_rest_through_quorum(
    stack: Stack, client: SagaClient, settings: Settings, order_id: str
) -> None:
    t = stack.bus.topology
    async with Bus(settings) as bus:
        channel = await bus.connection.channel()
        tap = await channel.declare_queue(exclusive=True)
        await tap.bind(t.actions_exchange, routing_key=t.request_key("inventory"))
        saga = await client.start("refund", order_id=order_id, params=REFUND)
        assert (await terminal(stack, saga)).status == "completed"
        copy = await tap.get(timeout=10)
        await channel.close()

    assert copy.type == "action.request"
    assert copy.delivery_mode == aio_pika.DeliveryMode.NOT_PERSISTENT
    queues = await asyncio.to_thread(broker_queues, settings.namespace)
    for service in t.services:
        assert (queues[t.request_queue(service)]["type"],
                queues[t.request_queue(service)]["durable"]) == ("classic", False)  # fmt: skip
        assert queues[t.action_queue(service)]["type"] == "quorum"  # settles stay durable
    for name in (t.intake_queue, t.partition_queue(0), t.dead_letter_queue):
        assert (queues[name]["type"], queues[name]["durable"]) == ("quorum", True)


def holding(queue: str, n: int) -> Callable[[dict[str, QueueDepth | None]], bool]:
    """Whether ``queue`` exists and holds at least ``n`` messages."""

    def check(depths: dict[str, QueueDepth | None]) -> bool:
        found = depths[queue]
        return found is not None and found.messages >= n

    return check


async def lose(bus: Bus, queue: str) -> None:
    """``queue`` deleted with what it holds, as its node going down deletes it."""
    channel = await bus.connection.channel()
    await channel.queue_delete(queue)
    await channel.close()


def patient(settings: Settings, tmp_path: Path) -> Settings:
    """A deadline 2.2 s after each send (``quick``), and a reservation sent up to 20 times: the
    sends never run out while the test waits, so no compensation can come of the wait."""
    fast = quick(settings, tmp_path)
    catalog = Path(fast.catalog_file)
    name = '[actions."inventory.reserve_stock"]'
    catalog.write_text(catalog.read_text().replace(name, f"{name}\nsends = 20"))
    return fast


async def test_requests_lost_with_their_queue_are_sent_again_and_every_saga_completes(
    settings: Settings, tmp_path: Path, pool: asyncpg.Pool, order_id: str
) -> None:
    """Five requests wait in the inventory's request queue (its adapter is not running), and the
    queue is deleted with them, as its node going down deletes it. The coordinator's watch finds
    it gone, declares it again and sends each lost request again at once, without using one of
    the step's sends (its budget grows by one). Once the adapter runs, every saga completes,
    none dead-lettered."""
    fast = patient(settings, tmp_path)
    coordinator = Stack(fast, ["coordinator", "erp", "payments", "email"])
    inventory = Stack(fast, ["inventory"])
    await coordinator.start()
    try:
        async with Bus(fast) as bus:
            queue = bus.topology.request_queue("inventory")
            sagas = [await publish_start(bus, f"{order_id}-{i}") for i in range(5)]

            await eventually(lambda: bus.depths([queue]), holding(queue, 5))
            await lose(bus, queue)
            # Sent again into the queue declared again.
            await eventually(lambda: bus.depths([queue]), holding(queue, 5), seconds=20)
        await inventory.start()
        states = [await terminal(coordinator, s) for s in sagas]
    finally:
        await inventory.stop()
        await coordinator.stop()
        await remove_namespace(fast)

    assert [s.status for s in states] == ["completed"] * 5
    # One send more than the catalog's 20: the resend after the loss was not counted.
    assert all(s.steps[0].max_sends == 21 and s.steps[0].sends >= 2 for s in states)
    dead = await pool.fetchval(
        "SELECT count(*) FROM dead_letters WHERE order_id LIKE $1", f"{order_id}-%"
    )
    assert dead == 0


async def test_a_request_published_while_its_queue_is_gone_is_sent_again_not_buried(
    settings: Settings, tmp_path: Path, pool: asyncpg.Pool, order_id: str
) -> None:
    """The queue is gone when the request is published: it comes back unroutable, and the
    coordinator declares the queue again and sends it once more (where an unroutable message
    of another kind is buried as a dead letter)."""
    fast = patient(settings, tmp_path)
    # The coordinator's watch stays out of it; the adapter subscribes again as usual.
    stack = Stack(fast.with_(watchdog_s=60.0), ["coordinator", "erp", "payments", "email"])
    inventory = Stack(fast, ["inventory"])
    await stack.start()
    await inventory.start()
    try:
        async with Bus(fast) as bus:
            await lose(bus, bus.topology.request_queue("inventory"))
            saga = await publish_start(bus, order_id)
        state = await terminal(stack, saga)
    finally:
        await inventory.stop()
        await stack.stop()
        await remove_namespace(fast)

    assert state.status == "completed"
    dead = await pool.fetchval("SELECT count(*) FROM dead_letters WHERE order_id = $1", order_id)
    assert dead == 0


async def test_in_roles_mode_a_request_that_keeps_failing_is_buried_and_blocks_its_order(
    role_stack: Stack, role_settings: Settings, deployment: Deployment, pool: asyncpg.Pool,
    order_id: str,
) -> None:  # fmt: skip
    """The e-mail adapter, on its own account, fails on every delivery (its table is gone):
    it counts the deliveries itself, and past the limit publishes the request to the dead
    letters, where the ingester believes the sender it names (the coordinator) because the
    letter comes from the service whose queue it is: a valid request, so it holds its order."""
    await pool.execute("ALTER TABLE sim_email_messages RENAME TO sim_email_messages_gone")
    try:
        async with Bus(role_settings, user=deployment.user("agent")) as bus:
            await publish_start(bus, order_id)
        [dead] = await eventually(
            lambda: dead_letters(pool, order_id), lambda rows: len(rows) == 1, seconds=60
        )
    finally:
        await pool.execute("ALTER TABLE sim_email_messages_gone RENAME TO sim_email_messages")

    assert (dead["reason"], dead["message_type"]) == ("delivery_limit", "action.request")
    assert dead["source_queue"] == f"{role_settings.namespace}.request.email"
    assert dead["routing_key"] == "request.email"
    assert dead["sender"] == deployment.user("coordinator")
    assert dead["blocks_order"] is True
    assert dead["delivery_count"] == role_settings.delivery_limit + 1
    assert "sim_email_messages" in dead["error"]
    counted = await pool.fetchval(
        "SELECT deliveries FROM delivery_counts WHERE message_id = $1", dead["message_id"]
    )
    assert counted == role_settings.delivery_limit + 2  # the last delivery buried it


async def test_in_roles_mode_a_request_not_from_the_coordinator_is_buried_as_forged(
    role_stack: Stack, role_settings: Settings, pool: asyncpg.Pool, order_id: str
) -> None:
    request = ActionRequest(
        saga_id="s-no-saga", order_id=order_id, action="email.send_customer_email",
        phase="forward", step=2, idempotency_key="s-no-saga:email.send_customer_email",
        params={"customer_email": "victim@example.com"}, timeout_s=5,
    )  # fmt: skip
    await publish_unsigned(role_stack, request, "request.email")  # its own account: not believed

    [dead] = await eventually(lambda: dead_letters(pool, order_id), lambda rows: len(rows) == 1)
    assert (dead["reason"], dead["blocks_order"]) == ("forged", False)
    assert dead["source_queue"] == f"{role_settings.namespace}.request.email"
    sent = await pool.fetchval(
        "SELECT count(*) FROM sim_email_messages WHERE order_id = $1", order_id
    )
    assert sent == 0


async def test_looking_for_missing_queues_leaves_no_channel_open(settings: Settings) -> None:
    """The broker closes a channel whose passive declare finds no queue; a robust channel then
    opened itself again, unseen: the watch leaked a channel per missing queue per look."""
    gone = [f"{settings.namespace}.gone.{n}" for n in range(3)]
    async with Bus(settings) as bus:
        transport = bus.connection.transport
        assert transport is not None
        channels = transport.connection.channels  # aiormq's, by number
        before = set(channels)
        for _ in range(3):
            assert await bus.missing(gone) == gone
            assert await bus.depths(gone) == dict.fromkeys(gone)
        try:
            await bus.declare()
            await asyncio.sleep(0.5)  # a robust channel reopens within a round trip
            assert set(channels) == before
        finally:
            await remove_namespace(settings)  # it left the test's topology in the broker
