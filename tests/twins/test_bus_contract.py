"""One contract, two implementations: the same messages published through RabbitMQ (with the
topology declared) and through the in-memory bus the test kit uses must land in the same
queues. A binding the twin gets wrong fails here, beside the real one."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import pytest

from saga_shared.config import Settings
from saga_shared.model.messages import AbortSaga, ActionRequest, SagaEvent
from saga_shared.transport.bus import Bus
from saga_shared.transport.memory_bus import MemoryBus, topic_matches
from saga_shared.transport.ports import Publisher
from tests.integration.helpers import remove_namespace


@dataclass
class Impl:
    name: str
    bus: Publisher
    depth: Callable[[str], Awaitable[int]]
    bind: Callable[[str], Awaitable[str]]  # a client's own queue on the events exchange


@pytest.fixture(
    params=[
        pytest.param("rabbitmq_impl", id="rabbitmq", marks=pytest.mark.integration),
        pytest.param("memory_impl", id="memory"),  # neither RabbitMQ nor Postgres: fast tier
    ]
)
def impl(request: pytest.FixtureRequest) -> Impl:
    # Only the chosen implementation's fixture is set up, so the memory half needs no broker.
    chosen: Impl = request.getfixturevalue(request.param)
    return chosen


@pytest.fixture
def memory_impl() -> Impl:
    memory = MemoryBus(Bus(Settings(namespace="twin", partitions=4)).topology)

    async def memory_depth(queue: str) -> int:
        return memory.depth(queue)

    async def memory_bind(pattern: str) -> str:
        queue = f"client-{uuid.uuid4().hex[:8]}"
        memory.bind(queue, memory.topology.events_exchange, pattern)
        return queue

    return Impl("memory", memory, memory_depth, memory_bind)


@pytest.fixture
async def rabbitmq_impl(settings: Settings) -> AsyncIterator[Impl]:
    async with Bus(settings) as real:
        await real.declare()
        channel = await real.connection.channel()

        async def rabbit_depth(queue: str) -> int:
            # Every publish was confirmed, so the queues hold them now.
            if queue.startswith(f"{settings.namespace}."):  # quorum: counted in declare-ok
                declared = await channel.declare_queue(queue, passive=True)
                return int(declared.declaration_result.message_count or 0)
            client = await channel.get_queue(queue, ensure=False)  # a client's: count by get
            held = 0
            while await client.get(fail=False, no_ack=True) is not None:
                held += 1
            return held

        async def rabbit_bind(pattern: str) -> str:
            queue = await channel.declare_queue(exclusive=True, auto_delete=True)
            await queue.bind(real.topology.events_exchange, pattern)
            return queue.name

        yield Impl("rabbitmq", real, rabbit_depth, rabbit_bind)
        await channel.close()
    await remove_namespace(settings)


def request(order_id: str, action: str = "erp.create_credit_note") -> ActionRequest:
    return ActionRequest(
        saga_id="s-1", order_id=order_id, action=action, phase="forward", step=0,
        idempotency_key=f"s-1:{action}", params={}, timeout_s=5,
    )  # fmt: skip


async def depths(impl: Impl) -> dict[str, int]:
    t = impl.bus.topology
    queues = [t.intake_queue, *(t.partition_queue(i) for i in range(t.partitions))]
    queues += [t.action_queue(s) for s in t.services]
    return {q: await impl.depth(q) for q in queues}


async def test_requests_reach_their_services_queue_only(impl: Impl) -> None:
    t = impl.bus.topology
    await impl.bus.publish(t.actions_exchange, "erp", request("o-1"))

    held = await depths(impl)
    assert held[t.action_queue("erp")] == 1
    assert sum(held.values()) == 1


async def test_partition_messages_and_commands_reach_their_partition_or_the_intake(
    impl: Impl,
) -> None:
    t = impl.bus.topology
    abort = AbortSaga(saga_id="s-2", order_id="o-2", reason="r")
    await impl.bus.publish(t.partitions_exchange, "2", abort)
    await impl.bus.publish(t.commands_exchange, "saga.abort.1", abort)
    await impl.bus.publish(t.commands_exchange, "saga.abort", abort)
    await impl.bus.publish(t.commands_exchange, "dlq.replay", abort)

    held = await depths(impl)
    assert held[t.partition_queue(2)] == 1
    assert held[t.partition_queue(1)] == 1
    assert held[t.intake_queue] == 2
    assert sum(held.values()) == 4


async def test_events_reach_the_queues_bound_to_their_type(impl: Impl) -> None:
    t = impl.bus.topology
    queues = [await impl.bind(p) for p in ("saga.*", "step.*", "#")]
    event = SagaEvent(
        type="saga.completed", saga_id="s-3", order_id="o-3", saga="refund", status="completed"
    )
    await impl.bus.publish(t.events_exchange, event.type, event)
    await impl.bus.publish(t.events_exchange, "nobody.listens", event)  # vanishes, no error

    assert [await impl.depth(q) for q in queues] == [1, 0, 2]


async def test_a_work_message_that_reaches_no_queue_is_an_error(impl: Impl) -> None:
    t = impl.bus.topology
    with pytest.raises(Exception, match=r"(?i)unroutable|no queue|NO_ROUTE|returned"):
        await impl.bus.publish(t.actions_exchange, "fax", request("o-4", "fax.send"))


@pytest.mark.parametrize(
    ("pattern", "key", "matches"),
    [("saga.*", "saga.completed", True), ("saga.*", "saga.start.3", False),
     ("saga.*.3", "saga.start.3", True), ("#", "a.b.c", True), ("saga.#", "saga", True),
     ("*", "", True), ("a.#.c", "a.c", True), ("a.#.c", "a.b.x.c", True), ("a.*", "b.c", False)],
)  # fmt: skip
def test_topic_patterns_match_as_amqp_does(pattern: str, key: str, matches: bool) -> None:
    assert topic_matches(pattern, key) is matches
