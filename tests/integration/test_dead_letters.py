"""Poison messages, blocked orders and the dead letters operators replay or discard."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable
from typing import Any, cast

import aio_pika
import asyncpg
import pytest

from saga_app.stack import Stack
from saga_coordinator.desk import DeadLetterDesk
from saga_coordinator.processor import Processor
from saga_coordinator.store import Tx
from saga_shared.client import SagaClient
from saga_shared.config import Settings
from saga_shared.model.messages import ReplayDeadLetters, Sender, StartSaga
from saga_shared.security import trust
from saga_shared.transport.bus import Bus
from tests.integration.helpers import (
    REFUND,
    eventually,
    publish_start,
    ran_one_after_another,
    terminal,
)
from tests.integration.sabotage import Sabotage


@pytest.fixture
async def bus(stack: Stack, settings: Settings) -> Any:
    async with Bus(settings) as connected:
        yield connected


def desk_of(stack: Stack) -> DeadLetterDesk:
    return DeadLetterDesk(stack.store, Processor(stack.catalog, stack.bus.topology))


async def dead_letters(pool: asyncpg.Pool, order_id: str | None) -> list[dict[str, Any]]:
    rows = await pool.fetch(
        "SELECT * FROM dead_letters WHERE order_id IS NOT DISTINCT FROM $1 ORDER BY id", order_id
    )
    return [dict(r) for r in rows]


async def wait_dead(
    pool: asyncpg.Pool, order_id: str | None, count: int = 1
) -> list[dict[str, Any]]:
    return await eventually(
        lambda: dead_letters(pool, order_id),
        lambda rows: len([r for r in rows if r["status"] == "dead"]) >= count,
    )


async def poison(bus: Bus, order_id: str | None, body: bytes, message_id: str) -> None:
    headers: dict[str, Any] = {} if order_id is None else {"x-order-id": order_id}
    key = bus.topology.partition_key(order_id or "no-order")
    message = aio_pika.Message(body, message_id=message_id, headers=headers)
    await bus.publish_raw(bus.topology.partitions_exchange, key, message)


def command_body(order_id: str | None, **changes: Any) -> bytes:
    body: dict[str, Any] = {
        # a message id names one message: each poison body gets its own
        "message_id": changes.pop("message_id", f"m-poison-{uuid.uuid4().hex[:8]}"),
        "type": "saga.start",
        "saga_id": "s-poison",
        "order_id": order_id,
        "saga": "refund",
        "params": REFUND,
    }
    body.update(changes)
    return json.dumps({k: v for k, v in body.items() if v is not None}).encode()


POISONS: dict[str, tuple[Callable[[str], bytes], str]] = {
    "not_json": (lambda o: b"{definitely not json", "not JSON"),
    "bad_utf8": (lambda o: b'{"order_id": "\xff\xfe"}', "UTF-8"),
    "schema_invalid": (lambda o: command_body(o, saga_id=None), "saga_id: Field required"),
    "unknown_type": (lambda o: command_body(o, type="saga.explode"), "saga.explode"),
    "oversized": (lambda o: command_body(o, saga="x" * 300_000), "over the limit"),
}


@pytest.mark.parametrize("kind", sorted(POISONS))
async def test_poison_is_dead_lettered_at_once_and_blocks_nothing(
    kind: str, stack: Stack, client: SagaClient, bus: Bus, pool: asyncpg.Pool, order_id: str
) -> None:
    make_body, words = POISONS[kind]
    await poison(bus, order_id, make_body(order_id), f"poison-{kind}")
    [dead] = await wait_dead(pool, order_id)
    assert dead["reason"] == "invalid"
    assert dead["delivery_count"] == 1  # not retried
    assert words in (dead["error"] or "")
    assert dead["blocks_order"] is False

    # Garbage that names an order holds nothing: only a valid message of the order may.
    later = [await publish_start(bus, order_id) for _ in range(2)]
    first, second = [await terminal(stack, s) for s in later]
    assert (first.status, second.status) == ("completed", "completed")
    assert ran_one_after_another(first, second)
    assert order_id not in [r["order_id"] for r in await stack.store.blocked_orders()]

    result = await desk_of(stack).discard(dead["id"], "ops", f"garbage: {kind}")
    assert result.done and "nothing changes for any saga" in result.detail


async def test_a_valid_message_in_the_wrong_partition_is_refused_and_blocks_nothing(
    stack: Stack, client: SagaClient, bus: Bus, pool: asyncpg.Pool, order_id: str
) -> None:
    right = int(bus.topology.partition_key(order_id))
    wrong = str((right + 1) % stack.settings.partitions)
    message = aio_pika.Message(command_body(order_id, saga_id="s-misrouted"), message_id="m-mis")
    await bus.publish_raw(bus.topology.partitions_exchange, wrong, message)

    [dead] = await wait_dead(pool, order_id)
    assert dead["reason"] == "invalid" and f"not {wrong}" in dead["error"]
    assert await stack.store.get("s-misrouted") is None
    saga = await client.start("refund", order_id=order_id, params=REFUND)
    assert (await terminal(stack, saga)).status == "completed"


async def test_message_without_order_id_is_dead_lettered_and_blocks_nothing(
    stack: Stack, client: SagaClient, bus: Bus, pool: asyncpg.Pool, order_id: str
) -> None:
    await poison(bus, None, command_body(None), "poison-orderless")
    [dead] = await wait_dead(pool, None)
    assert dead["reason"] == "invalid"
    assert "order_id" in (dead["error"] or "")
    assert dead["message_id"] not in [r["message_id"] for r in await stack.store.blocked_orders()]
    saga = await client.start("refund", order_id=order_id, params=REFUND)
    assert (await terminal(stack, saga)).status == "completed"


async def test_handler_raising_every_time_goes_to_the_dead_letters_then_replay_drains(
    stack: Stack, bus: Bus, pool: asyncpg.Pool, sabotage: Sabotage, order_id: str
) -> None:
    sabotage.always("s-doomed")
    await publish_start(bus, order_id, "s-doomed")
    later = [await publish_start(bus, order_id) for _ in range(2)]

    [dead] = await wait_dead(pool, order_id)
    assert dead["reason"] == "delivery_limit"
    assert dead["delivery_count"] == stack.settings.delivery_limit + 1
    assert sabotage.raised["s-doomed"] == stack.settings.delivery_limit + 1
    assert "simulated handler bug" in dead["error"]
    # the traceback goes with the dead letter (the retries logged one line each)
    assert "Traceback (most recent call last)" in dead["error"]
    assert dead["exchange"] == bus.topology.partitions_exchange
    await eventually(lambda: stack.store.parked(order_id), lambda rows: len(rows) == 2)

    sabotage.stop("s-doomed")
    desk = desk_of(stack)
    assert (await desk.replay(dead["id"], "ops")).done
    again = await desk.replay(dead["id"], "ops")  # idempotent: nothing republished twice
    assert not again.done and "already replayed" in again.detail

    states = [await terminal(stack, s) for s in ("s-doomed", *later)]
    assert [s.status for s in states] == ["completed"] * 3
    assert ran_one_after_another(states[0], states[1])
    assert ran_one_after_another(states[1], states[2])
    effects = await pool.fetch(
        "SELECT action, count(*) AS n FROM sim_effects WHERE order_id = $1 GROUP BY action",
        order_id,
    )
    assert {r["action"]: r["n"] for r in effects}["email.send_customer_email"] == 3
    assert order_id not in [r["order_id"] for r in await stack.store.blocked_orders()]


async def test_a_dead_copy_of_a_command_already_applied_holds_nothing(
    stack: Stack, bus: Bus, pool: asyncpg.Pool, order_id: str
) -> None:
    """An agent sent a start twice (its confirm was lost): one copy was applied, the other used
    up its deliveries. Its letter is kept, but blocking the order would stop it for a replay
    that can only be absorbed: the block its failures left is lifted, and the order's next
    saga runs without anyone."""
    command = StartSaga(saga_id=f"s-{uuid.uuid4().hex[:10]}", order_id=order_id,
                        saga="refund", params=REFUND)  # fmt: skip
    await bus.publish(bus.topology.commands_exchange, command.type, command)
    assert (await terminal(stack, command.saga_id)).status == "completed"
    # the dead copy had failed before and left its block, and the order's next start waits
    key = trust.forwarded_id(bus.user or "", command.message_id)
    await stack.store.run(lambda tx: tx.block(order_id, key, "retrying", "RuntimeError: boom"))
    after = await publish_start(bus, order_id)
    await eventually(lambda: stack.store.parked(order_id), lambda rows: len(rows) == 1)

    queue = bus.topology.intake_queue
    death: dict[str, Any] = {
        "queue": queue, "reason": "delivery_limit", "count": 1, "routing-keys": [command.type],
        "exchange": bus.topology.commands_exchange,
    }  # fmt: skip
    copy = aio_pika.Message(
        command.model_dump_json().encode(), message_id=command.message_id, type=command.type,
        user_id=bus.user, headers={"x-order-id": order_id, "x-first-death-queue": queue,
                                   "x-death": cast(Any, [death])},
    )  # fmt: skip
    await bus.publish_raw(bus.topology.dead_letter_exchange, "", copy)

    [dead] = await wait_dead(pool, order_id)
    assert (dead["reason"], dead["blocks_order"]) == ("delivery_limit", False)
    assert "another copy of it was applied: it holds nothing" in dead["error"]
    assert (await terminal(stack, after)).status == "completed"  # the block lifted, it ran
    assert await stack.store.blocks(order_id) == []


async def test_handler_raising_twice_recovers_in_order_without_a_dead_letter(
    stack: Stack, bus: Bus, pool: asyncpg.Pool, sabotage: Sabotage, order_id: str
) -> None:
    sabotage.times("s-shaky", 2)
    await publish_start(bus, order_id, "s-shaky")
    after = await publish_start(bus, order_id)

    first, second = await terminal(stack, "s-shaky"), await terminal(stack, after)

    assert sabotage.raised["s-shaky"] == 2
    assert (first.status, second.status) == ("completed", "completed")
    assert ran_one_after_another(first, second)
    assert await dead_letters(pool, order_id) == []
    assert order_id not in [r["order_id"] for r in await stack.store.blocked_orders()]


async def test_replayed_message_that_fails_again_returns_with_its_history(
    stack: Stack, bus: Bus, pool: asyncpg.Pool, sabotage: Sabotage, order_id: str
) -> None:
    sabotage.always("s-stubborn")
    await publish_start(bus, order_id, "s-stubborn")
    [dead] = await wait_dead(pool, order_id)
    desk = desk_of(stack)

    await desk.replay(dead["id"], "ops", "first try")
    [again] = await eventually(
        lambda: dead_letters(pool, order_id),
        lambda rows: rows[0]["times_dead"] == 2 and rows[0]["status"] == "dead",
    )
    assert again["id"] == dead["id"]
    assert len(json.loads(again["history"])) == 1
    assert [b["state"] for b in await stack.store.blocks(order_id)] == ["dead"]

    sabotage.stop("s-stubborn")
    await desk.replay(dead["id"], "ops", "second try")
    assert (await terminal(stack, "s-stubborn")).status == "completed"
    audit = (await desk.get(dead["id"]))["audit"]
    assert [(a["action"], a["note"]) for a in audit] == [
        ("replay", "first try"),
        ("replay", "second try"),
    ]


async def test_replay_by_order_and_all_keeps_each_orders_order(
    stack: Stack, bus: Bus, pool: asyncpg.Pool, sabotage: Sabotage, order_id: str
) -> None:
    other_order = f"{order_id}-b"
    sabotage.always("s-a1")
    sabotage.always("s-b1")
    await publish_start(bus, order_id, "s-a1")
    await publish_start(bus, other_order, "s-b1")
    await wait_dead(pool, order_id)
    await wait_dead(pool, other_order)
    after_a = await publish_start(bus, order_id)
    sabotage.stop("s-a1")
    sabotage.stop("s-b1")
    desk = desk_of(stack)

    for dl_id in await desk.ids(order_id):
        await desk.replay(dl_id, "ops")
    a1, a2 = await terminal(stack, "s-a1"), await terminal(stack, after_a)
    assert ran_one_after_another(a1, a2)
    assert await stack.store.get("s-b1") is None  # another order: untouched by --order

    # --all: every dead letter of the database (earlier tests left some of their own)
    [b_dead] = [r["id"] for r in await dead_letters(pool, other_order)]
    replayed = {
        r.dead_letter_id: r.done
        for r in [await desk.replay(i, "ops") for i in await desk.ids(None)]
    }
    assert replayed[b_dead] is True
    assert (await terminal(stack, "s-b1")).status == "completed"
    assert await desk.ids(order_id) == []
    assert await desk.ids(other_order) == []


async def test_an_unroutable_outbox_row_becomes_a_dead_letter_and_wedges_nothing(
    stack: Stack, client: SagaClient, pool: asyncpg.Pool, order_id: str
) -> None:
    await pool.execute(
        "INSERT INTO outbox (exchange, routing_key, message_id, message_type, order_id, body)"
        " VALUES ($1, 'x', 'm-lost', 'action.request', $2, '{}'::bytea)",
        f"{stack.settings.namespace}.no-such-exchange",
        order_id,
    )
    [dead] = await wait_dead(pool, order_id)
    assert dead["reason"] == "unroutable"
    assert "NOT_FOUND" in dead["error"]
    assert [b["message_id"] for b in await stack.store.blocks(order_id)] == ["m-lost"]

    other = await client.start("refund", order_id=f"{order_id}-other", params=REFUND)
    assert (await terminal(stack, other)).status == "completed"


async def test_ingester_killed_before_commit_loses_no_dead_letter(
    settings: Settings, pool: asyncpg.Pool, order_id: str
) -> None:
    from saga_coordinator.dead_letters import DeadLetterIngester
    from saga_coordinator.store import Store

    entered = asyncio.Event()

    class Frozen(Store):
        async def run(self, work: Any) -> Any:  # the commit never comes
            entered.set()
            await asyncio.Event().wait()

    async with Bus(settings) as setup:
        await setup.declare()
        dead = aio_pika.Message(
            b"poison", message_id="m-dl-crash", headers={"x-order-id": order_id}
        )
        await setup.publish_raw(setup.topology.dead_letter_exchange, "", dead)

        # A killed process has no grace for the deliveries in hand: none is given, rather than
        # waiting out SAGA_STOP_GRACE_S (30 s) for a commit that never comes.
        doomed_bus = Bus(settings.with_(stop_grace_s=0.1))
        await doomed_bus.connect()
        doomed = asyncio.create_task(DeadLetterIngester(settings, doomed_bus, Frozen(pool)).run())
        await asyncio.wait_for(entered.wait(), 10)
        await doomed_bus.close()  # the process dies: its connection drops, nothing was acked
        doomed.cancel()
        await asyncio.gather(doomed, return_exceptions=True)

        survivor = asyncio.create_task(DeadLetterIngester(settings, setup, Store(pool)).run())
        try:
            rows = await eventually(lambda: dead_letters(pool, order_id), lambda r: len(r) == 1)
        finally:
            survivor.cancel()
            await asyncio.gather(survivor, return_exceptions=True)
            channel = await setup.connection.channel()
            await setup.topology.delete(channel)
    assert rows[0]["message_id"] == "m-dl-crash"
    assert rows[0]["body"] == b"poison"


async def test_a_replay_header_naming_no_dead_letter_does_not_make_the_letter_vanish(
    stack: Stack, bus: Bus, pool: asyncpg.Pool, order_id: str
) -> None:
    forged = aio_pika.Message(
        b"{oops", message_id="m-forged", headers={"x-order-id": order_id, "x-replay-of": "999999"}
    )
    await bus.publish_raw(bus.topology.dead_letter_exchange, "", forged)

    [dead] = await wait_dead(pool, order_id)
    assert (dead["message_id"], dead["body"]) == ("m-forged", b"{oops")
    assert dead["blocks_order"] is False  # garbage holds no order
    assert await stack.store.blocks(order_id) == []


async def test_an_order_blocked_before_it_had_a_saga_is_shown_with_what_waits(
    stack: Stack, bus: Bus, pool: asyncpg.Pool, sabotage: Sabotage, settings: Settings,
    order_id: str,
) -> None:  # fmt: skip
    from tests.integration.test_cli import saga, saga_json

    sabotage.always("s-first")
    await publish_start(bus, order_id, "s-first")
    await wait_dead(pool, order_id)
    await publish_start(bus, order_id)
    await eventually(lambda: stack.store.parked(order_id), lambda rows: len(rows) == 1)

    shown = await saga_json(settings, "show", "--order", order_id)
    assert shown["sagas"] == [] and [b["state"] for b in shown["order_blocked_by"]] == ["dead"]
    assert [p["message_type"] for p in shown["parked"]] == ["saga.start"]
    code, out, _ = await saga(settings, "show", "--order", order_id)
    assert code == 0 and "no saga yet, but the order is held" in out and "BLOCKED" in out


async def test_a_letter_the_ingester_cannot_store_is_kept_as_bytes_then_moved_never_looped(
    settings: Settings, pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch, order_id: str
) -> None:
    """Storing fails (a bug): the letter is kept as bare bytes with an alert. Storing even that
    fails: after the delivery limit it is moved to the last-resort queue, confirmed, with its
    bytes; no endless redelivery either way."""
    from saga_coordinator import dead_letters as module
    from saga_coordinator.dead_letters import DeadLetterIngester
    from saga_coordinator.relay import Relay
    from saga_coordinator.store import Store

    real = module.record_death

    async def fails_for_the_first(tx: Tx, letter: module.Letter) -> int:
        if letter.message_id == "m-first" and letter.reason != "unstorable":
            raise RuntimeError("a bug in storing")
        if letter.message_id.startswith("m-second"):
            raise RuntimeError("a bug in storing even the bytes")
        return await real(tx, letter)

    monkeypatch.setattr(module, "record_death", fails_for_the_first)
    async with Bus(settings) as bus:
        await bus.declare()
        alerts = await (await bus.connection.channel()).declare_queue(exclusive=True)
        await alerts.bind(bus.topology.events_exchange, routing_key="alert.#")
        for mid in ("m-first", "m-second"):
            letter = aio_pika.Message(b"\x00\xffbytes", message_id=mid,
                                      headers={"x-order-id": order_id})  # fmt: skip
            await bus.publish_raw(bus.topology.dead_letter_exchange, "", letter)
        ingester = asyncio.create_task(DeadLetterIngester(settings, bus, Store(pool)).run())
        relay = asyncio.create_task(Relay(settings, pool, bus).run())  # publishes the alert
        try:
            kept = await eventually(
                lambda: pool.fetch("SELECT * FROM dead_letters WHERE transport_id = 'm-first'"),
                lambda rows: len(rows) == 1,
            )
            last_resort = await bus.connection.channel()
            queue = await last_resort.get_queue(bus.topology.last_resort_queue)
            moved = await eventually(
                lambda: queue.get(fail=False, no_ack=True), lambda m: m is not None
            )
            alert = await eventually(
                lambda: alerts.get(fail=False, no_ack=True), lambda m: m is not None
            )
        finally:
            ingester.cancel()
            relay.cancel()
            await asyncio.gather(ingester, relay, return_exceptions=True)
            channel = await bus.connection.channel()
            await bus.topology.delete(channel)
    assert (kept[0]["reason"], kept[0]["body"], kept[0]["blocks_order"]) == (
        "unstorable", b"\x00\xffbytes", False,
    )  # fmt: skip
    assert moved is not None and moved.body == b"\x00\xffbytes" and moved.message_id == "m-second"
    assert "x-last-resort" in (moved.headers or {})
    assert alert is not None and json.loads(alert.body)["type"] == "alert.unstorable"


async def test_a_command_sent_straight_to_its_partition_that_keeps_failing_is_replayed_in_order(
    stack: Stack, bus: Bus, client: SagaClient, pool: asyncpg.Pool, sabotage: Sabotage,
    order_id: str,
) -> None:  # fmt: skip
    sabotage.always("s-direct")
    command = json.loads(command_body(order_id, saga_id="s-direct", message_id="m-direct"))
    key = bus.topology.command_key("saga.start", order_id)
    await bus.publish_raw(bus.topology.commands_exchange, key,
                          aio_pika.Message(json.dumps(command).encode()))  # fmt: skip
    [dead] = await wait_dead(pool, order_id)
    later = await client.start("refund", order_id=order_id, params=REFUND)
    await eventually(lambda: stack.store.parked(order_id), lambda rows: len(rows) == 1)
    assert (dead["reason"], dead["blocks_order"], dead["exchange"]) == (
        "delivery_limit", True, bus.topology.commands_exchange,
    )  # fmt: skip
    sabotage.stop("s-direct")

    assert (await desk_of(stack).replay(dead["id"], "ops")).done
    a, b = await terminal(stack, "s-direct"), await terminal(stack, later)
    assert (a.status, b.status) == ("completed", "completed")
    assert ran_one_after_another(a, b)
    assert order_id not in [r["order_id"] for r in await stack.store.blocked_orders()]


async def test_replay_by_reason_takes_that_reasons_letters_and_no_other(
    stack: Stack, bus: Bus, pool: asyncpg.Pool, sabotage: Sabotage, order_id: str
) -> None:
    sabotage.always("s-r1")
    await publish_start(bus, order_id, "s-r1")
    [dead] = await wait_dead(pool, order_id)
    await poison(bus, f"{order_id}-p", b"{not json", f"m-garbage-{order_id}")
    [garbage] = await wait_dead(pool, f"{order_id}-p")
    assert dead["reason"] != garbage["reason"]
    sabotage.stop("s-r1")

    command = ReplayDeadLetters(death_reason=dead["reason"], sender=Sender(user="ops", role="ops"))
    reply = await desk_of(stack).perform(command)

    assert reply.type == "desk.done"
    assert (await terminal(stack, "s-r1")).status == "completed"
    [after] = await dead_letters(pool, f"{order_id}-p")
    assert after["status"] == "dead"  # another reason: not replayed
