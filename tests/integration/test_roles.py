"""Trust comes from the broker: every role on its own account, and what each may do enforced
twice, by RabbitMQ's permissions and by the checks of the sender on every message."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine
from typing import Any

import aio_pika
import aiormq
import asyncpg
import pytest
from aio_pika.abc import AbstractChannel

from saga_app.stack import Stack
from saga_coordinator.incident import render_markdown
from saga_services.faults import add_fault
from saga_shared.client import CommandRejected, SagaClient
from saga_shared.config import Settings
from saga_shared.model.messages import ActionDone, ActionRequest
from saga_shared.transport.bus import Bus
from saga_shared.transport.codec import message_to_amqp
from tests.integration.deployment import Deployment, _rabbitmqctl
from tests.integration.helpers import REFUND, eventually
from tests.integration.test_gates_and_abort import CHECKOUT


def _bare(message: ActionDone | ActionRequest) -> aio_pika.Message:
    """The message as the codec builds it, for aio-pika's own exchange: it sends no user_id."""
    out = message_to_amqp(message)
    p = out.properties
    return aio_pika.Message(
        out.body, message_id=p.message_id, type=p.message_type, headers=p.headers,
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
    )  # fmt: skip


async def publish_unsigned(stack: Stack, request: ActionRequest, routing_key: str) -> None:
    """``request`` on the actions exchange from the coordinator's own account, but without a
    ``user_id`` (aio-pika's exchange sets none)."""
    connection = await aio_pika.connect(stack.bus.url)
    try:
        channel = await connection.channel(publisher_confirms=True)
        exchange = await channel.get_exchange(stack.bus.topology.actions_exchange)
        await exchange.publish(_bare(request), routing_key, timeout=10)
    finally:
        await connection.close()


class As:
    """``async with As(settings, user) as (bus, client)``: a client on that user's account."""

    def __init__(self, settings: Settings, user: str) -> None:
        self.bus = Bus(settings, user=user)
        self.client = SagaClient(self.bus, answer_within_s=20)

    async def __aenter__(self) -> tuple[Bus, SagaClient]:
        await self.bus.connect()
        await self.client.open()
        return self.bus, self.client

    async def __aexit__(self, *exc: object) -> None:
        await self.client.close()
        await self.bus.close()


async def dead_letters(pool: asyncpg.Pool, order_id: str) -> list[dict[str, Any]]:
    rows = await pool.fetch("SELECT * FROM dead_letters WHERE order_id = $1 ORDER BY id", order_id)
    return [dict(r) for r in rows]


async def step_status(stack: Stack, saga_id: str, step: int) -> str | None:
    state = await stack.store.get(saga_id)
    return None if state is None else state.steps[step].status


async def test_refund_and_a_gated_checkout_run_with_every_process_on_its_own_role(
    role_stack: Stack, role_settings: Settings, deployment: Deployment, order_id: str
) -> None:
    async with As(role_settings, deployment.user("agent")) as (_, agent):
        refund = await agent.start("refund", order_id=order_id, params=REFUND)
        assert (await agent.wait(refund, seconds=30)).type == "saga.completed"
        gated = await agent.start("checkout_approved", order_id=f"{order_id}-c", params=CHECKOUT)
        assert (await agent.wait(gated, seconds=30, stops=True)).type == "saga.awaiting_approval"
        # an agent may not even publish a decision: the broker refuses the routing key
        with pytest.raises(aiormq.exceptions.ChannelAccessRefused, match=r"saga\.approve"):
            await agent.approve(gated, order_id=f"{order_id}-c", note="I approve myself")
    async with As(role_settings, deployment.user("ops")) as (_, ops):
        with pytest.raises(CommandRejected, match="needs a person's decision"):
            await ops.approve(gated, order_id=f"{order_id}-c", note="automation says yes")

    async with As(role_settings, deployment.user("ana")) as (_, ana):
        await ana.approve(gated, order_id=f"{order_id}-c", note="address checked by phone")
        assert (await ana.wait(gated, seconds=30)).type == "saga.completed"

    state = await role_stack.store.get(gated)
    assert state is not None and state.status == "completed"
    assert state.started_by is not None and state.started_by.user == deployment.user("agent")
    [decision] = state.decisions
    assert (decision.kind, decision.by, decision.role) == (
        "approve",
        deployment.user("ana"),
        "person",
    )
    assert f"approve by {deployment.user('ana')} (person)" in render_markdown(state)


Attempt = Callable[[AbstractChannel, Settings], Coroutine[Any, Any, object]]


async def _publish(channel: AbstractChannel, exchange: str, key: str) -> None:
    target = await channel.get_exchange(exchange, ensure=False) if exchange else None
    message = aio_pika.Message(b"{}", user_id=None)
    if target is None:
        await channel.default_exchange.publish(message, key, timeout=10)
    else:
        await target.publish(message, key, timeout=10)


ATTEMPTS: dict[str, Attempt] = {
    "publish to the partitions": lambda ch, s: _publish(ch, f"{s.namespace}.partitions", "0"),
    "publish to the actions": lambda ch, s: _publish(ch, f"{s.namespace}.actions", "email"),
    "publish to the events": lambda ch, s: _publish(ch, f"{s.namespace}.events", "saga.completed"),
    "publish to an action queue": lambda ch, s: _publish(ch, "", f"{s.namespace}.action.email"),
    "send a command it may not (resolve)": lambda ch, s: _publish(
        ch, f"{s.namespace}.commands", "saga.resolve"
    ),
    "declare a queue": lambda ch, s: ch.declare_queue(f"{s.namespace}.mine", durable=True),
    "delete a queue": lambda ch, s: ch.queue_delete(f"{s.namespace}.intake"),
    "consume another queue": lambda ch, s: _consume(ch, f"{s.namespace}.partition.0"),
    "bind to the commands": lambda ch, s: _bind(ch, f"{s.namespace}.commands"),
}


async def _consume(channel: AbstractChannel, queue: str) -> None:
    async def ignore(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        raise AssertionError("a message was delivered to an agent")

    found = await channel.get_queue(queue, ensure=False)
    await found.consume(ignore)


async def _bind(channel: AbstractChannel, exchange: str) -> None:
    mine = await channel.declare_queue(exclusive=True)
    await mine.bind(exchange, routing_key="#")


@pytest.mark.parametrize("what", sorted(ATTEMPTS))
async def test_with_agent_credentials_the_broker_refuses(
    what: str, role_stack: Stack, role_settings: Settings, deployment: Deployment
) -> None:
    async with Bus(role_settings, user=deployment.user("agent")) as bus:
        channel = await bus.connection.channel(publisher_confirms=True)
        with pytest.raises(aiormq.exceptions.ChannelAccessRefused):
            await ATTEMPTS[what](channel, role_settings)


async def test_a_publish_naming_another_user_is_refused_by_the_broker(
    role_stack: Stack, role_settings: Settings, deployment: Deployment
) -> None:
    async with Bus(role_settings, user=deployment.user("agent")) as bus:
        channel = await bus.connection.channel(publisher_confirms=True)
        exchange = await channel.get_exchange(f"{role_settings.namespace}.commands", ensure=False)
        forged = aio_pika.Message(b"{}", user_id=deployment.user("ana"))
        with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed):
            await exchange.publish(forged, "saga.start", timeout=10)


async def test_forged_outcomes_change_nothing_and_are_dead_lettered_as_forged(
    role_settings: Settings, deployment: Deployment, pool: asyncpg.Pool, order_id: str
) -> None:
    """While the ERP adapter is down, an outcome for its step comes from the inventory's
    account, and one with no user_id at all: both are refused; the saga waits for the real one."""
    stack = Stack(role_settings, ["coordinator", "inventory", "email"])
    await stack.start()
    erp: Stack | None = None
    try:
        async with (
            As(role_settings, deployment.user("agent")) as (_, agent),
            As(role_settings, deployment.user("ops")) as (ops_bus, _),
        ):
            alerts = await _alerts(ops_bus)
            saga_id = await agent.start("refund", order_id=order_id, params=REFUND)
            await eventually(lambda: step_status(stack, saga_id, 1), lambda s: s == "running")
            forged = ActionDone(
                saga_id=saga_id, order_id=order_id, action="erp.create_credit_note",
                phase="forward", step=1, idempotency_key=f"{saga_id}:erp.create_credit_note",
                result={"credit_note_id": "cn-FORGED"},
            )  # fmt: skip
            async with Bus(role_settings, user=deployment.user("inventory")) as inventory:
                await inventory.to_partition(forged)  # user_id: the inventory's own
                channel = await inventory.connection.channel(publisher_confirms=True)
                exchange = await channel.get_exchange(f"{role_settings.namespace}.partitions")
                anonymous = _bare(forged.model_copy(update={"message_id": "m-anon"}))
                await exchange.publish(anonymous, stack.bus.topology.partition_key(order_id))

            dead = await eventually(
                lambda: dead_letters(pool, order_id), lambda rows: len(rows) == 2
            )
            assert {r["reason"] for r in dead} == {"forged"}
            assert not any(r["blocks_order"] for r in dead)
            assert {r["sender"] for r in dead} == {deployment.user("inventory"), None}
            seen = [json.loads(await asyncio.wait_for(alerts.get(), 20)) for _ in range(2)]
            assert {a["type"] for a in seen} == {"alert.forged"}
            assert await step_status(stack, saga_id, 1) == "running"

            erp = Stack(role_settings, ["erp"])
            await erp.start()
            assert (await agent.wait(saga_id, seconds=30)).type == "saga.completed"
        state = await stack.store.get(saga_id)
        assert state is not None
        assert state.steps[1].result is not None
        assert state.steps[1].result["credit_note_id"] != "cn-FORGED"
        notes = await pool.fetchval(
            "SELECT count(*) FROM sim_erp_credit_notes WHERE order_id = $1", order_id
        )
        assert notes == 1
    finally:
        if erp is not None:
            await erp.stop()
        await stack.stop()


async def _alerts(bus: Bus) -> asyncio.Queue[bytes]:
    found: asyncio.Queue[bytes] = asyncio.Queue()
    channel = await bus.connection.channel()
    queue = await channel.declare_queue(exclusive=True)
    await queue.bind(f"{bus.topology.events_exchange}", routing_key="alert.#")

    async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        await found.put(message.body)

    await queue.consume(on_message, no_ack=True)
    return found


async def test_an_account_that_may_send_no_command_hears_why_and_its_command_is_kept(
    role_stack: Stack, role_settings: Settings, deployment: Deployment, pool: asyncpg.Pool,
    order_id: str,
) -> None:  # fmt: skip
    """An account the broker knows but the deployment gave no role (here guest, allowed into
    the vhost by an administrator's mistake): its command is refused with the reason, not left
    unanswered, and kept as a dead letter (forged)."""
    _rabbitmqctl("set_permissions", "-p", deployment.vhost, "guest", ".*", ".*", ".*")
    # the URL's own account: guest
    async with Bus(role_settings) as bus, SagaClient(bus, answer_within_s=20) as stranger:
        assert bus.user == "guest"
        with pytest.raises(CommandRejected, match="user 'guest' may not send commands"):
            await stranger.start("refund", order_id=order_id, params=REFUND)
    [dead] = await eventually(lambda: dead_letters(pool, order_id), lambda rows: len(rows) == 1)
    assert (dead["reason"], dead["sender"]) == ("forged", "guest")


async def test_a_request_that_did_not_come_from_the_coordinator_sends_no_email(
    role_stack: Stack, role_settings: Settings, deployment: Deployment, pool: asyncpg.Pool,
    order_id: str,
) -> None:  # fmt: skip
    request = ActionRequest(
        saga_id="s-no-saga", order_id=order_id, action="email.send_customer_email",
        phase="forward", step=2, idempotency_key="s-no-saga:email.send_customer_email",
        params={"customer_email": "victim@example.com"}, timeout_s=5,
    )  # fmt: skip
    # Only the coordinator may write to the actions exchange; without a user_id even its own
    # account is not believed.
    await publish_unsigned(role_stack, request, "email")

    [dead] = await eventually(lambda: dead_letters(pool, order_id), lambda rows: len(rows) == 1)
    assert dead["reason"] == "forged" and dead["blocks_order"] is False
    sent = await pool.fetchval(
        "SELECT count(*) FROM sim_email_messages WHERE order_id = $1", order_id
    )
    assert sent == 0


async def test_only_a_person_resolves_and_an_agent_acts_only_on_its_own_sagas(
    role_stack: Stack, role_settings: Settings, deployment: Deployment, pool: asyncpg.Pool,
    order_id: str,
) -> None:  # fmt: skip
    await add_fault(pool, "erp.create_credit_note", order_id, "permanent")
    await add_fault(pool, "inventory.release_stock", order_id, "permanent")
    async with As(role_settings, deployment.user("agent")) as (agent_bus, agent):
        saga_id = await agent.start("refund", order_id=order_id, params=REFUND)
        assert (await agent.wait(saga_id, seconds=30)).type == "saga.needs_human"
        with pytest.raises(aiormq.exceptions.ChannelAccessRefused, match=r"saga\.resolve"):
            await agent.resolve(saga_id, order_id=order_id, note="done it myself")
        # a body claiming to be someone else is refused: the sender is set by the intake
        claimed = {
            "type": "saga.abort", "saga_id": saga_id, "order_id": order_id, "reason": "x",
            "sender": {"user": deployment.user("ana"), "role": "person"},
            "by_kind": "person", "reply_to": "amq.gen-nowhere",
        }  # fmt: skip
        await agent_bus.publish_raw(
            agent_bus.topology.commands_exchange, "saga.abort",
            aio_pika.Message(json.dumps(claimed).encode(), message_id="m-claimed"),
        )  # fmt: skip
    async with As(role_settings, deployment.user("agent-2")) as (_, other):
        with pytest.raises(CommandRejected, match="not started by"):
            await other.abort(saga_id, order_id=order_id, reason="not mine to abort")
    async with As(role_settings, deployment.user("ops")) as (_, ops):
        with pytest.raises(CommandRejected, match="only a person may resolve"):
            await ops.resolve(saga_id, order_id=order_id, note="automation resolves it")

    async with As(role_settings, deployment.user("dana")) as (_, dana):
        await dana.resolve(saga_id, order_id=order_id, note="released the stock by hand")
        assert (await dana.wait(saga_id, seconds=30)).type == "saga.resolved"

    state = await role_stack.store.get(saga_id)
    assert state is not None and state.status == "resolved"
    assert [(d.kind, d.by, d.role) for d in state.decisions] == [
        ("resolve", deployment.user("dana"), "person")
    ]
    rules = await pool.fetch(
        "SELECT rule, sender FROM rejections WHERE saga_id = $1 OR message_id = 'm-claimed'"
        " ORDER BY id",
        saga_id,
    )
    assert [(r["rule"], r["sender"]) for r in rules] == [
        ("invalid_message", deployment.user("agent")),
        ("not_permitted", deployment.user("agent-2")),
        ("not_permitted", deployment.user("ops")),
    ]


async def test_an_agent_over_its_rate_is_refused_with_a_reason(
    role_settings: Settings, deployment: Deployment, pool: asyncpg.Pool, order_id: str
) -> None:
    settings = role_settings.with_(agent_rate=0.5, agent_burst=3)
    stack = Stack(settings)
    await stack.start()
    try:
        async with As(settings, deployment.user("agent")) as (_, agent):
            tries = await asyncio.gather(
                *(agent.status(f"s-{i}", order_id=order_id) for i in range(6)),
                return_exceptions=True,
            )
        reasons = [str(t) for t in tries if isinstance(t, CommandRejected)]
        assert len([r for r in reasons if "commands a second" in r]) == 3
        limited = await pool.fetchval(
            "SELECT count(*) FROM rejections WHERE rule = 'rate_limited' AND sender = $1",
            deployment.user("agent"),
        )
        assert limited >= 3
    finally:
        await stack.stop()
