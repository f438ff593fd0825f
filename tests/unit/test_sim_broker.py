"""The simulated broker: routing as the topology binds, publishing with confirms, and the
queue semantics of RabbitMQ's quorum queues the system relies on (docs/explanation/design.md,
"RabbitMQ and Postgres facts")."""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import pytest

from saga_app.sim.broker import Broker, BrokerConfig, Connection, FakeDelivery
from saga_app.sim.errors import BrokerDown, NotFound, Unroutable, UserIdMismatch
from saga_app.sim.loop import run
from saga_shared.transport.codec import Outgoing, to_amqp
from saga_shared.transport.memory_bus import MemoryBus
from saga_shared.transport.topology import Topology

TOPOLOGY = Topology("sim", 4, 3, declared_services=("inventory", "email"))
T = TOPOLOGY
HOP = (0.001, 0.002)


def message(i: int | str, order: str = "o-1", **headers: Any) -> Outgoing:
    return to_amqp(
        b"{}", message_id=f"m-{i}", message_type="saga.start", order_id=order, headers=headers
    )


def broker(seed: int = 1, **config: Any) -> Broker:
    return Broker(TOPOLOGY, random.Random(seed), BrokerConfig(**{"hop_s": HOP, **config}))


def simulate(body: Callable[[Broker], Coroutine[Any, Any, Any]], **config: Any) -> Any:
    return run(body(broker(**config)))


Policy = Callable[[FakeDelivery, int], Awaitable[None]]


class Recorder:
    """A consumer's callback: keeps every delivery, then settles it as ``policy`` says (by
    default, acks it)."""

    def __init__(self, policy: Policy | None = None) -> None:
        self.seen: list[FakeDelivery] = []
        self.policy = policy

    async def __call__(self, delivery: FakeDelivery) -> None:
        self.seen.append(delivery)
        if self.policy is None:
            await delivery.ack()
        else:
            await self.policy(delivery, len(self.seen))

    @property
    def ids(self) -> list[str | None]:
        return [d.message_id for d in self.seen]


async def publish_all(connection: Connection, exchange: str, key: str, count: int) -> None:
    for i in range(count):
        await connection.publish(exchange, key, message(i), mandatory=True)


# --- routing ------------------------------------------------------------------------------
def test_every_binding_of_the_topology_routes_as_the_in_memory_twin_routes() -> None:
    twin = MemoryBus(TOPOLOGY)
    keys = [(e, k.replace("*", "start").replace("#", "any.thing")) for e, k, _ in T.bindings()]
    keys += [(T.commands_exchange, "saga.start"), (T.commands_exchange, "dlq.replay"),
             (T.commands_exchange, "nothing.here"), (T.actions_exchange, "payments"),
             ("", T.last_resort_queue), ("", "no-such-queue")]  # fmt: skip

    async def body(b: Broker) -> list[tuple[list[str], list[str]]]:
        return [(sorted(b.router.route(e, k, b.queues)), twin.route(e, k)) for e, k in keys]

    for ours, theirs in simulate(body):
        assert ours == theirs


def test_commands_reach_their_partition_or_the_intake_by_their_key() -> None:
    async def body(b: Broker) -> dict[str, int]:
        agent = b.connect("agent")
        key = T.command_key("saga.start", "o-1")
        await agent.publish(T.commands_exchange, key, message(1), mandatory=True)
        await agent.publish(T.commands_exchange, "saga.start", message(2), mandatory=True)
        await agent.publish(T.commands_exchange, "dlq.replay", message(3), mandatory=True)
        partition = T.partition_queue(int(T.partition_key("o-1")))
        return {q: b.depth(q) for q in (partition, T.intake_queue)}

    partition = T.partition_queue(int(T.partition_key("o-1")))
    assert simulate(body) == {partition: 1, T.intake_queue: 2}


def test_a_client_queue_takes_the_events_its_pattern_matches() -> None:
    async def body(b: Broker) -> int:
        listener = b.connect("ops")
        b.declare_client_queue("listener", owner=listener)
        b.bind("listener", T.events_exchange, "saga.*")
        for kind in ("saga.completed", "step.done", "saga.needs_human"):
            await listener.publish(T.events_exchange, kind, message(kind))
        return b.depth("listener")

    assert simulate(body) == 2


# --- publishing ---------------------------------------------------------------------------
def test_a_publish_is_confirmed_two_hops_later_and_delivered_with_its_properties() -> None:
    async def body(b: Broker) -> tuple[float, FakeDelivery]:
        agent = b.connect("agent")
        recorder = Recorder()
        b.connect("coordinator").consume(T.intake_queue, recorder)
        original = message(1, reply_to_hint="x")
        original.properties.user_id = "agent"
        original.properties.correlation_id = "c-1"
        await agent.publish(T.commands_exchange, "saga.start", original, mandatory=True)
        took = asyncio.get_running_loop().time()
        await asyncio.sleep(1)
        return took, recorder.seen[0]

    took, delivery = simulate(body)
    assert 2 * HOP[0] <= took <= 2 * HOP[1]
    assert (delivery.message_id, delivery.type, delivery.user_id) == ("m-1", "saga.start", "agent")
    assert delivery.headers == {"x-order-id": "o-1", "reply_to_hint": "x"}
    assert (delivery.exchange, delivery.routing_key) == (T.commands_exchange, "saga.start")
    assert delivery.correlation_id == "c-1" and delivery.content_type == "application/json"
    assert delivery.delivery_mode.value == 2 and delivery.redelivered is False


def test_a_mandatory_publish_no_queue_takes_comes_back_and_any_other_is_dropped() -> None:
    async def body(b: Broker) -> tuple[float, list[str]]:
        c = b.connect()
        await c.publish(T.events_exchange, "nobody.listens", message(1))  # not mandatory
        with pytest.raises(Unroutable):
            await c.publish(T.actions_exchange, "no-such-service", message(2), mandatory=True)
        return asyncio.get_running_loop().time(), [e.kind for e in b.trace]

    took, kinds = simulate(body)
    assert took > 0  # the return comes from the broker, a round trip later
    assert kinds == ["connect", "publish", "dropped", "confirm", "publish", "returned", "confirm"]


def test_a_publish_is_refused_at_once_for_a_missing_exchange_or_a_forged_user() -> None:
    async def body(b: Broker) -> float:
        c = b.connect("agent")
        with pytest.raises(NotFound):
            c.send("no-such-exchange", "k", message(1))
        forged = message(2)
        forged.properties.user_id = "coordinator"
        with pytest.raises(UserIdMismatch):
            c.send(T.commands_exchange, "saga.start", forged)
        return asyncio.get_running_loop().time()

    assert simulate(body) == 0.0


def test_while_the_broker_is_down_publishing_and_connecting_fail_at_once() -> None:
    async def body(b: Broker) -> float:
        c = b.connect()
        b.crash()
        with pytest.raises(BrokerDown):
            c.send(T.commands_exchange, "saga.start", message(1))
        with pytest.raises(BrokerDown):
            b.connect()
        b.restart()
        await b.connect().publish(T.commands_exchange, "saga.start", message(1))
        return float(b.depth(T.intake_queue))

    assert simulate(body) == 1


# --- queues -------------------------------------------------------------------------------
def test_a_queue_is_fifo_and_a_consumer_holds_at_most_its_prefetch() -> None:
    async def body(b: Broker) -> tuple[list[str | None], int]:
        most = 0

        async def slow(delivery: FakeDelivery, _: int) -> None:
            nonlocal most
            most = max(most, b.unacked(T.intake_queue))
            await asyncio.sleep(0.01)
            await delivery.ack()

        recorder = Recorder(slow)
        b.connect().consume(T.intake_queue, recorder, prefetch=3)
        await publish_all(b.connect(), T.commands_exchange, "saga.start", 12)
        await asyncio.sleep(1)
        return recorder.ids, most

    ids, most = simulate(body)
    assert ids == [f"m-{i}" for i in range(12)]
    assert most == 3


def test_a_requeued_message_goes_back_before_later_ones_with_its_count_raised() -> None:
    async def reject_first_twice(delivery: FakeDelivery, n: int) -> None:
        await (delivery.reject(requeue=True) if n <= 2 else delivery.ack())

    async def body(b: Broker) -> list[FakeDelivery]:
        recorder = Recorder(reject_first_twice)
        await publish_all(b.connect(), T.commands_exchange, "saga.start", 3)
        b.connect().consume(T.intake_queue, recorder, prefetch=1)
        await asyncio.sleep(1)
        return recorder.seen

    seen = simulate(body)
    assert [d.message_id for d in seen] == ["m-0", "m-0", "m-0", "m-1", "m-2"]
    assert [d.headers.get("x-delivery-count") for d in seen] == [None, 1, 2, None, None]
    assert [d.redelivered for d in seen] == [False, True, True, False, False]


def test_past_the_delivery_limit_a_message_is_dead_lettered_and_the_next_one_delivered() -> None:
    async def always_reject(delivery: FakeDelivery, _: int) -> None:
        if delivery.message_id == "m-0":
            await delivery.reject(requeue=True)
        else:
            await delivery.ack()

    async def body(b: Broker) -> tuple[Recorder, Recorder]:
        work, dead = Recorder(always_reject), Recorder()
        await publish_all(b.connect(), T.commands_exchange, "saga.start.1", 2)
        b.connect().consume(T.partition_queue(1), work, prefetch=1)
        b.connect().consume(T.dead_letter_queue, dead)
        await asyncio.sleep(1)
        return work, dead

    work, dead = simulate(body)
    limit = T.delivery_limit
    assert work.ids == ["m-0"] * (limit + 1) + ["m-1"]  # the convoy breaks, by design
    [letter] = dead.seen
    assert (letter.message_id, letter.exchange, letter.routing_key) == (
        "m-0", T.dead_letter_exchange, "saga.start.1",
    )  # fmt: skip
    [death] = letter.headers["x-death"]
    assert death["reason"] == "delivery_limit" and death["count"] == 1
    assert death["queue"] == T.partition_queue(1)
    assert (death["exchange"], death["routing-keys"]) == (T.commands_exchange, ["saga.start.1"])
    assert letter.headers["x-first-death-reason"] == "delivery_limit"
    assert letter.headers["x-first-death-queue"] == T.partition_queue(1)
    assert "x-delivery-count" not in letter.headers  # the dead-letter queue's first delivery


def test_a_reject_without_requeue_dead_letters_at_once() -> None:
    async def refuse(delivery: FakeDelivery, _: int) -> None:
        await delivery.reject(requeue=False)

    async def body(b: Broker) -> tuple[int, FakeDelivery]:
        work, dead = Recorder(refuse), Recorder()
        await publish_all(b.connect(), T.actions_exchange, "email", 1)
        b.connect().consume(T.action_queue("email"), work)
        b.connect().consume(T.dead_letter_queue, dead)
        await asyncio.sleep(1)
        return len(work.seen), dead.seen[0]

    tries, letter = simulate(body)
    assert tries == 1
    assert letter.headers["x-first-death-reason"] == "rejected"
    assert letter.headers["x-death"][0]["queue"] == T.action_queue("email")


def test_a_message_that_dies_again_keeps_its_first_death_and_counts_each_kind() -> None:
    async def refuse(delivery: FakeDelivery, _: int) -> None:
        await delivery.reject(requeue=False)

    async def body(b: Broker) -> list[FakeDelivery]:
        dead = Recorder()
        b.connect().consume(T.partition_queue(1), Recorder(refuse))
        b.connect().consume(T.action_queue("email"), Recorder(refuse))
        b.connect().consume(T.dead_letter_queue, dead)
        c = b.connect()
        await c.publish(T.partitions_exchange, "1", message(1), mandatory=True)
        for exchange, key in ((T.partitions_exchange, "1"), (T.actions_exchange, "email")):
            await asyncio.sleep(1)
            again = dead.seen[-1]  # republished with the headers it died with, as is
            await c.publish(exchange, key, Outgoing(again.body, again.properties))
        await asyncio.sleep(1)
        return dead.seen

    *_, last = simulate(body)
    deaths = [(d["queue"], d["reason"], d["count"]) for d in last.headers["x-death"]]
    assert deaths == [
        (T.action_queue("email"), "rejected", 1),
        (T.partition_queue(1), "rejected", 2),
    ]
    assert last.headers["x-first-death-queue"] == T.partition_queue(1)
    assert last.headers["x-last-death-queue"] == T.action_queue("email")


@pytest.mark.parametrize(("nack_counts", "counts"), [(False, [None, None]), (True, [None, 1])])
def test_a_requeueing_nack_raises_the_count_only_before_rabbitmq_4_3(
    nack_counts: bool, counts: list[int | None]
) -> None:
    async def nack_once(delivery: FakeDelivery, n: int) -> None:
        await (delivery.nack(requeue=True) if n == 1 else delivery.ack())

    async def body(b: Broker) -> list[FakeDelivery]:
        recorder = Recorder(nack_once)
        await publish_all(b.connect(), T.commands_exchange, "saga.start", 1)
        b.connect().consume(T.intake_queue, recorder)
        await asyncio.sleep(1)
        return recorder.seen

    seen = simulate(body, nack_counts=nack_counts)
    assert [d.headers.get("x-delivery-count") for d in seen] == counts
    assert seen[1].redelivered is True


def test_a_quorum_queue_without_a_limit_drops_past_rabbitmq_4s_default_of_20() -> None:
    async def always_reject(delivery: FakeDelivery, _: int) -> None:
        await delivery.reject(requeue=True)

    async def body(b: Broker) -> tuple[int, str]:
        recorder = Recorder(always_reject)
        await b.connect().publish("", T.dead_letter_queue, message(1))
        b.connect().consume(T.dead_letter_queue, recorder)
        await asyncio.sleep(1)
        return len(recorder.seen), b.trace[-1].kind

    assert simulate(body) == (21, "dropped")


def test_deliveries_go_round_robin_on_a_queue_without_single_active_consumer() -> None:
    async def body(b: Broker) -> tuple[list[str | None], list[str | None]]:
        first, second = Recorder(), Recorder()
        b.connect().consume(T.action_queue("inventory"), first)
        b.connect().consume(T.action_queue("inventory"), second)
        await publish_all(b.connect(), T.actions_exchange, "inventory", 6)
        await asyncio.sleep(1)
        return first.ids, second.ids

    first, second = simulate(body)
    assert first == ["m-0", "m-2", "m-4"] and second == ["m-1", "m-3", "m-5"]


def test_the_same_seed_gives_the_same_trace_and_another_seed_other_timings() -> None:
    async def body(b: Broker) -> list[Any]:
        for queue in (T.intake_queue, T.action_queue("email")):
            b.connect().consume(queue, Recorder(), prefetch=2)
        c = b.connect()
        sends = [c.send(T.commands_exchange, "saga.start", message(i)) for i in range(20)]
        sends += [c.send(T.actions_exchange, "email", message(i)) for i in range(20, 40)]
        await asyncio.gather(*sends)
        await asyncio.sleep(1)
        return list(b.trace)

    first = run(body(broker(seed=5)))
    assert first == run(body(broker(seed=5)))
    other = run(body(broker(seed=6)))
    assert [e.at for e in other] != [e.at for e in first]
    assert all(a.at <= b.at for a, b in itertools.pairwise(first))
