"""One contract, two implementations: the same messages published through RabbitMQ (with the
topology declared) and through the in-memory bus the test kit uses must land in the same
queues. A binding the twin gets wrong fails here, beside the real one."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import pytest

from saga_shared.config import Settings
from saga_shared.model.messages import AbortSaga, ActionDone, ActionRequest, SagaEvent
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
    lose: Callable[[str], Awaitable[None]]  # a non-durable queue gone with its node


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

    async def memory_lose(queue: str) -> None:
        memory.lose(queue)

    return Impl("memory", memory, memory_depth, memory_bind, memory_lose)


@pytest.fixture
async def rabbitmq_impl(settings: Settings) -> AsyncIterator[Impl]:
    async with Bus(settings) as real:
        await real.declare()
        channel = await real.connection.channel()

        async def rabbit_depth(queue: str) -> int:
            # Every publish was confirmed, so the queues hold them now.
            if queue.startswith(f"{settings.namespace}."):  # ours: counted in declare-ok
                # On a channel of its own each time: a robust channel answers a second passive
                # declare of a name with the first one's count.
                fresh = await real.connection.channel()
                declared = await fresh.declare_queue(queue, passive=True)
                await fresh.close()
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

        async def rabbit_lose(queue: str) -> None:
            await channel.queue_delete(queue)

        yield Impl("rabbitmq", real, rabbit_depth, rabbit_bind, rabbit_lose)
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


def done(order_id: str) -> ActionDone:
    return ActionDone(
        saga_id="s-5", order_id=order_id, action="erp.create_credit_note", step=0,
        phase="forward", attempt=1, idempotency_key="s-5:erp.create_credit_note", result={},
    )  # fmt: skip


async def test_an_outcome_reaches_its_partitions_outcome_queue_or_its_quorum_queue_if_gone(
    impl: Impl,
) -> None:
    """A service's outcome goes to the classic outcome queue of the order's partition; with that
    queue lost, the outcomes exchange's alternate exchange routes it to the partition's quorum
    queue: it is never returned, never lost."""
    t = impl.bus.topology
    outcome = done("o-5")
    p = int(t.partition_key(outcome.order_id))
    assert t.answer_exchange(outcome.type) == t.outcomes_exchange
    await impl.bus.publish(t.outcomes_exchange, str(p), outcome)
    assert await impl.depth(t.outcome_queue(p)) == 1
    assert sum((await depths(impl)).values()) == 0

    await impl.lose(t.outcome_queue(p))
    await impl.bus.publish(t.outcomes_exchange, str(p), outcome)
    held = await depths(impl)
    assert held[t.partition_queue(p)] == 1
    assert sum(held.values()) == 1


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
