"""Bad input gets a clear error and loses nothing: no crash, no silent drop."""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from typing import Any

import aio_pika
import asyncpg
import pamqp.frame
import pytest

from saga_app.stack import Stack
from saga_shared.amqp_internals import incoming, wire
from saga_shared.client import CommandRejected, SagaClient
from saga_shared.config import Settings
from saga_shared.transport.bus import Bus
from tests.integration.helpers import eventually, remove_namespace
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


async def _wait_for_probe(pool: asyncpg.Pool, marker: str) -> dict[str, Any]:
    """The one rejection of the hostile publisher's message, found by the marker its body
    carries (its message id may be what could not be read)."""
    needle = json.dumps(marker).encode()
    for _ in range(100):
        rows = await pool.fetch("SELECT * FROM rejections WHERE position($1 in body) > 0", needle)
        if rows:
            assert len(rows) == 1, rows  # once, not once per redelivery
            return dict(rows[0])
        await asyncio.sleep(0.1)
    raise AssertionError(f"no rejection recorded for the message marked {marker}")


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


def _hostile_start(order: str, **changes: object) -> bytes:
    body: dict[str, object] = {
        "message_id": f"m-hostile-{uuid.uuid4().hex[:8]}",
        "type": "saga.start",
        "saga_id": f"s-{uuid.uuid4().hex[:8]}",
        "order_id": order,
        "saga": "refund",
        "params": dict(REFUND),
    }
    body.update(changes)
    return json.dumps(body).encode()


HOSTILE_STARTS: dict[str, tuple[dict[str, object], str]] = {
    "sql in the order id": ({"order_id": "A-1'; DROP TABLE sagas; --"}, "order_id"),
    "control characters in the saga id": ({"saga_id": "s\u001b[2J"}, "control character"),
    "a NUL in a parameter": ({"params": {**REFUND, "sku": "SKU\u00001"}}, "U+0000"),
    "a lone surrogate in a parameter": ({"params": {**REFUND, "sku": "\ud800"}}, "surrogate"),
    "a quantity of 10**30": ({"params": {**REFUND, "quantity": 10**30}}, "64-bit"),
    "a quantity over the column": ({"params": {**REFUND, "quantity": 2**31}}, "2147483647"),
    "a claimed person": ({"by_kind": "person", "by": "cfo@example.com"}, "by_kind"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_STARTS))
async def test_a_hostile_start_is_refused_with_a_reply_and_blocks_nothing(
    case: str, stack: Stack, client: SagaClient, settings: Settings, pool: asyncpg.Pool,
    order_id: str,
) -> None:  # fmt: skip
    changes, words = HOSTILE_STARTS[case]
    async with Bus(settings) as bus:
        channel = await bus.connection.channel()
        replies = await channel.declare_queue(exclusive=True)
        body = _hostile_start(order_id, reply_to=replies.name, **changes)
        await bus.publish_raw(bus.topology.commands_exchange, "saga.start", aio_pika.Message(body))
        message = await eventually(lambda: replies.get(fail=False), lambda m: m is not None)
        assert message is not None
        reply = json.loads(message.body)
        await channel.close()

    assert reply["type"] == "command.rejected" and words in reply["reason"]
    assert reply["order_id"] in (order_id, "unknown")
    [row] = await eventually(
        lambda: pool.fetch("SELECT * FROM rejections WHERE body = $1", body),
        lambda rows: len(rows) == 1,
    )
    assert words in row["reason"]
    # the order, or the victim the hostile id pointed at, still works
    state = await run_saga(client, stack, "refund", order_id, REFUND)
    assert state.status == "completed"


async def test_a_body_nested_100000_levels_deep_is_refused_and_recorded(
    stack: Stack, settings: Settings, pool: asyncpg.Pool
) -> None:
    deep = b'{"type": "saga.start", "params": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    async with Bus(settings) as bus:
        message = aio_pika.Message(deep, message_id=f"m-deep-{uuid.uuid4().hex[:6]}")
        await bus.publish_raw(bus.topology.commands_exchange, "saga.start", message)
    [row] = await eventually(
        lambda: pool.fetch("SELECT * FROM rejections WHERE transport_id = $1", message.message_id),
        lambda rows: len(rows) == 1,
    )
    assert "nested deeper than 32 levels" in row["reason"]


async def test_a_command_sent_straight_to_a_partition_is_checked_there_and_refused_alike(
    stack: Stack, client: SagaClient, settings: Settings, pool: asyncpg.Pool, order_id: str
) -> None:
    """The usual path: the client names the order's partition in the routing key. Garbage and
    a wrong partition are refused with a reply and a rejection, not dead-lettered."""
    topology = stack.bus.topology
    right = topology.command_key("saga.start", order_id)
    wrong = f"saga.start.{(int(topology.partition_key(order_id)) + 1) % settings.partitions}"
    async with Bus(settings) as bus:
        channel = await bus.connection.channel()
        replies = await channel.declare_queue(exclusive=True)
        misrouted = _hostile_start(order_id, reply_to=replies.name)
        for key, body, mid in ((wrong, misrouted, "m-wrong"), (right, b"{not json", "m-junk")):
            message = aio_pika.Message(body, message_id=f"{mid}-{order_id}")
            await bus.publish_raw(topology.commands_exchange, key, message)
        answer = await eventually(
            lambda: replies.get(fail=False, no_ack=True), lambda m: m is not None
        )
        assert answer is not None
        await channel.close()

    reply = json.loads(answer.body)
    assert reply["type"] == "command.rejected" and repr(right) in reply["reason"]
    rows = await eventually(
        lambda: pool.fetch(
            "SELECT transport_id, rule FROM rejections WHERE transport_id = ANY($1) ORDER BY id",
            [f"m-wrong-{order_id}", f"m-junk-{order_id}"],
        ),
        lambda found: len(found) == 2,
    )
    assert {r["rule"] for r in rows} == {"routing_key", "invalid_message"}
    assert (
        await pool.fetchval("SELECT count(*) FROM dead_letters WHERE order_id = $1", order_id) == 0
    )
    assert (await run_saga(client, stack, "refund", order_id, REFUND)).status == "completed"


async def test_a_command_whose_order_header_names_another_order_is_refused(
    stack: Stack, settings: Settings, pool: asyncpg.Pool, order_id: str
) -> None:
    """A partition keys its deliveries by the ``x-order-id`` header before it reads the body
    (two of one order never in hand at once): a header naming another order could let a
    command slip past a failed message of its own order, so it is refused, with a reply."""
    topology = stack.bus.topology
    async with Bus(settings) as bus:
        channel = await bus.connection.channel()
        replies = await channel.declare_queue(exclusive=True)
        body = _hostile_start(order_id, reply_to=replies.name)
        message = aio_pika.Message(
            body, message_id=f"m-header-{order_id}", headers={"x-order-id": f"{order_id}-other"}
        )
        await bus.publish_raw(
            topology.commands_exchange, topology.command_key("saga.start", order_id), message
        )
        answer = await eventually(
            lambda: replies.get(fail=False, no_ack=True), lambda m: m is not None
        )
        assert answer is not None
        await channel.close()
    reply = json.loads(answer.body)
    assert reply["type"] == "command.rejected"
    assert f"header x-order-id '{order_id}-other' names another order" in reply["reason"]
    [row] = await eventually(
        lambda: pool.fetch(
            "SELECT rule FROM rejections WHERE transport_id = $1", f"m-header-{order_id}"
        ),
        lambda rows: len(rows) == 1,
    )
    assert row["rule"] == "invalid_message"
    assert await pool.fetchval("SELECT count(*) FROM sagas WHERE order_id = $1", order_id) == 0


_HOSTILE_PUBLISHER = """
import asyncio, datetime, json, struct, sys
import aio_pika, pamqp.frame
sys.setrecursionlimit(100_000)  # the publisher's own encoder recurses too
url, exchange, user, message_id, kind = sys.argv[1:6]
headers, when, route, marker = {}, None, "saga.start", message_id
marshal = pamqp.frame.marshal
def bent(old: bytes, new: bytes) -> None:  # the frames as aio-pika writes them, bytes swapped
    pamqp.frame.marshal = lambda frame, channel: marshal(frame, channel).replace(old, new)
if kind == "deep":
    deep: dict = {}
    for _ in range(3000):
        deep = {"a": deep}
    headers = {"deep": deep}
elif kind == "when":  # a timestamp any 64 bits can say: the year 584 million
    when = datetime.datetime(2000, 1, 1, tzinfo=datetime.timezone.utc)
    bent(struct.pack(">Q", 946684800), b"\\xff" * 8)
elif kind == "id":  # RabbitMQ checks no short string for UTF-8
    message_id = "NOTUTF8!"
    bent(b"NOTUTF8!", b"\\xff\\xfe" * 4)
elif kind == "name":
    headers = {"NOTUTF8!": "v"}
    bent(b"NOTUTF8!", b"\\xff\\xfe" * 4)
else:  # "route" (to the intake by saga.*) or "route-0" (to partition 0 by saga.*.0)
    route = "saga.NOTUTF8!" + kind[len("route"):].replace("-", ".")
    bent(b"NOTUTF8!", b"\\xff\\xfe" * 4)
async def main() -> None:
    connection = await aio_pika.connect(url)
    channel = await connection.channel(publisher_confirms=True)
    target = await channel.get_exchange(exchange, ensure=False)
    message = aio_pika.Message(json.dumps({"probe": marker}).encode(), message_id=message_id,
                               user_id=user, headers=headers, timestamp=when)
    await target.publish(message, routing_key=route)
    await connection.close()
asyncio.run(main())
"""


async def test_a_header_nested_3000_deep_is_refused_and_the_stack_carries_on(
    stack: Stack, client: SagaClient, settings: Settings, pool: asyncpg.Pool, order_id: str
) -> None:
    """RabbitMQ passes such a header on; decoding it exceeds Python's recursion limit, which
    used to close the consumer's connection on every redelivery. It is refused, named, once."""
    message_id = f"deep-{order_id}"
    # The stack runs in this process: at Python's default limit, as a service runs (a test
    # library may have raised it).
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)
    try:
        reason = await _refused_by_name(stack, client, settings, pool, order_id, message_id, "deep")
    finally:
        sys.setrecursionlimit(limit)
    assert "header 'deep': nested too deeply to decode" in reason


async def test_a_timestamp_out_of_range_is_refused_and_the_stack_carries_on(
    stack: Stack, client: SagaClient, settings: Settings, pool: asyncpg.Pool, order_id: str
) -> None:
    """RabbitMQ passes any 64-bit timestamp on; decoding one past Python's datetime range
    closed the consumer's connection on every redelivery. It is refused, named, once."""
    message_id = f"when-{order_id}"
    reason = await _refused_by_name(stack, client, settings, pool, order_id, message_id, "when")
    assert "property 'timestamp': year 584556019 is out of range" in reason


@pytest.mark.parametrize(
    ("kind", "words"),
    [
        ("id", "property 'message_id': not UTF-8 (byte 0xff at 0)"),
        ("name", "a header's name: not UTF-8 (byte 0xff at 0)"),
        ("route", "discriminator 'type'"),  # read, then refused for its body (no type)
        ("route-0", "discriminator 'type'"),
    ],
    ids=["message id", "header name", "routing key to the intake", "routing key to a partition"],
)
async def test_a_name_that_is_not_utf8_is_refused_and_the_stack_carries_on(
    stack: Stack, client: SagaClient, settings: Settings, pool: asyncpg.Pool, order_id: str,
    kind: str, words: str,
) -> None:  # fmt: skip
    """RabbitMQ checks no short string for UTF-8 (a property, a header's name, a routing key,
    which ``saga.*`` and ``saga.*.0`` route on); pamqp's error on one closed the consumer's
    connection on every redelivery, stalling the intake or a partition. It is refused once:
    a name left out and marked, a routing key read escaped (then its body, which names no
    command type, is what is refused)."""
    reason = await _refused_by_name(
        stack, client, settings, pool, order_id, f"{kind}-{order_id}", kind
    )
    assert words in reason


async def test_with_the_fast_frames_off_a_timestamp_out_of_range_is_refused_all_the_same(
    settings: Settings, pool: asyncpg.Pool, order_id: str
) -> None:
    """``SAGA_FAST_FRAMES=0`` gives up speed, not this protection: pamqp decodes every frame,
    and the one it cannot decode is still delivered marked and refused, once."""
    plain = settings.with_(fast_frames=False)
    running = Stack(plain)
    await running.start()
    try:
        assert pamqp.frame.unmarshal is wire.guarded_unmarshal
        async with Bus(plain) as bus, SagaClient(bus, answer_within_s=20) as agent:
            reason = await _refused_by_name(
                running, agent, plain, pool, order_id, f"when-{order_id}", "when"
            )
    finally:
        await running.stop()
        await remove_namespace(plain)
        wire.install(True)  # the default, as the next test's buses would leave it
        incoming.install(True)
    assert "property 'timestamp': year 584556019 is out of range" in reason


async def _refused_by_name(
    stack: Stack, client: SagaClient, settings: Settings, pool: asyncpg.Pool, order_id: str,
    message_id: str, kind: str,
) -> str:  # fmt: skip
    """Publishes the hostile start, then runs a saga: the reason the start was refused."""
    async with Bus(settings) as bus:
        user, exchange = bus.user or "", bus.topology.commands_exchange
    publisher = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _HOSTILE_PUBLISHER, settings.amqp_url, exchange, user, message_id,
        kind,
    )  # fmt: skip
    assert await publisher.wait() == 0
    row = await _wait_for_probe(pool, message_id)
    assert row["rule"] == "invalid_message"

    state = await run_saga(client, stack, "refund", order_id, REFUND)
    assert state.status == "completed"
    return str(row["reason"])
