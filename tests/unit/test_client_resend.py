"""The client's resend schedule, and which of its outcomes a caller gets: the reply, or
``CommandRejected``, ``NotAnswered`` (sent, and queued or perhaps queued) or
``BrokerUnreachable`` (nothing sent). The bus is a fake: its publish does what each test says
(confirm, hang, fail), and replies are handed to the client as its reply queue would."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any, cast

import aiormq
import pamqp.commands
import pytest
from aio_pika.abc import AbstractIncomingMessage, AbstractQueue
from pydantic import JsonValue

from saga_shared.client import (
    BrokerUnreachable,
    CommandRejected,
    MessageIdReused,
    NotAnswered,
    ResendSchedule,
    SagaClient,
)
from saga_shared.config import Settings
from saga_shared.model.messages import CommandReply, DeskReply, Outbound
from saga_shared.transport.bus import Bus
from saga_shared.transport.codec import encode
from saga_shared.transport.topology import Topology

PARAMS: dict[str, JsonValue] = {
    "sku": "SKU-1", "quantity": 1, "amount_cents": 100, "customer_email": "a@example.com",
}  # fmt: skip
Behaviour = Callable[[int], Awaitable[None]]


async def confirmed(number: int) -> None:
    """The broker confirms at once."""


async def never_confirmed(number: int) -> None:
    await asyncio.sleep(60)


class FakeBus:
    """What the client uses of ``Bus``: publish (doing ``behaviour``), topology, settings, url,
    and whether it is connected. ``answer``: after which send a reply comes, and which."""

    def __init__(self, behaviour: Behaviour = confirmed) -> None:
        self.settings = Settings(partitions=4)
        self.topology = Topology.from_settings(self.settings)
        self.url = "amqp://agent:s3cret@broker.example:5672/"
        self.connected = True
        self.connection = SimpleNamespace(connected=asyncio.Event())
        self.connection.connected.set()
        self.behaviour = behaviour
        self.sent: list[tuple[str, str, Outbound]] = []
        self.answer: tuple[int, Callable[[Any], CommandReply | DeskReply]] | None = None
        self.client: SagaClient | None = None

    async def publish(
        self, exchange: str, key: str, message: Outbound, headers: dict[str, Any] | None = None
    ) -> None:
        self.sent.append((exchange, key, message))
        await self.behaviour(len(self.sent))
        if self.answer is not None and self.answer[0] == len(self.sent):
            reply = self.answer[1](message)
            assert self.client is not None
            delivered = cast(AbstractIncomingMessage, SimpleNamespace(body=encode(reply)))
            asyncio.get_running_loop().call_soon(
                lambda: asyncio.ensure_future(self.client._on_reply(delivered))  # type: ignore[union-attr]
            )


def accepted(command: Any, kind: str = "command.accepted", **changes: Any) -> CommandReply:
    fields = {
        "type": kind, "saga_id": command.saga_id, "order_id": command.order_id,
        "command_id": command.message_id, "command_type": command.type,
        "reason": "no" if kind == "command.rejected" else "",
    }  # fmt: skip
    return CommandReply(**{**fields, **changes})


def client_of(bus: FakeBus, **options: Any) -> SagaClient:
    settings = {"resend_every_s": 0.05, "resend_max_s": 0.05, **options}
    client = SagaClient(cast(Bus, bus), **settings)
    client._reply_queue = cast(AbstractQueue, SimpleNamespace(name="amq.gen-test"))
    bus.client = client
    return client


# --- the schedule -----------------------------------------------------------------------------


def test_the_default_schedule_resends_after_2_s_then_backs_off_to_10() -> None:
    schedule = ResendSchedule()
    pauses = schedule.pauses()
    assert [next(pauses) for _ in range(7)] == [2.0, 3.0, 4.5, 6.75, 10.0, 10.0, 10.0]
    assert schedule.send_times(3) == [0.0, 2.0]
    assert schedule.send_times(10) == [0.0, 2.0, 5.0, 9.5]
    assert schedule.send_times(30) == [0.0, 2.0, 5.0, 9.5, 16.25, 26.25]
    assert schedule.send_times(1) == [0.0]


def test_a_steady_schedule_without_backoff() -> None:
    assert ResendSchedule(1.0, 1.0, 1.0).send_times(3.5) == [0.0, 1.0, 2.0, 3.0]


@pytest.mark.parametrize(
    ("every", "backoff", "cap"), [(0, 1.5, 10), (-1, 1.5, 10), (2, 0.5, 10), (2, 1.5, 1)]
)
def test_a_schedule_that_makes_no_sense_is_refused(
    every: float, backoff: float, cap: float
) -> None:
    with pytest.raises(ValueError, match="resend_"):
        ResendSchedule(every, backoff, cap)


def test_reply_timeout_s_is_a_deprecated_alias_of_answer_within_s() -> None:
    with pytest.warns(DeprecationWarning, match="answer_within_s"):
        client = SagaClient(cast(Bus, FakeBus()), reply_timeout_s=7)
    assert client.answer_within_s == 7 == client.reply_timeout_s
    assert SagaClient(cast(Bus, FakeBus())).answer_within_s == 30.0


# --- the outcomes ------------------------------------------------------------------------------


async def test_unanswered_it_is_sent_again_with_the_same_id_and_body_then_not_answered() -> None:
    bus = FakeBus()
    client = client_of(bus)
    began = time.monotonic()
    with pytest.raises(NotAnswered) as caught:
        await client.start("refund", order_id="A-17", params=PARAMS, saga_id="s-A17",
                           message_id="m-1", answer_within_s=0.4)  # fmt: skip
    assert time.monotonic() - began < 1.5
    assert len(bus.sent) >= 5  # every 0.05 s for 0.4 s
    assert {encode(message) for _, _, message in bus.sent} == {encode(bus.sent[0][2])}
    assert {key for _, key, _ in bus.sent} == {bus.topology.command_key("saga.start", "A-17")}
    unanswered = caught.value
    assert (unanswered.message_id, unanswered.saga_id, unanswered.order_id) == (
        "m-1", "s-A17", "A-17",
    )  # fmt: skip
    assert unanswered.sends == len(bus.sent) and unanswered.queued
    said = str(unanswered)
    assert f"sent {len(bus.sent)} times as message m-1" in said
    assert "it is queued" in said and "will be applied when the coordinator runs" in said
    assert "same message id m-1 (or the same saga id s-A17) is safe" in said
    assert isinstance(unanswered, TimeoutError)  # as callers caught it before
    assert unanswered.facts()["queued"] is True


async def test_an_answer_to_the_third_send_ends_the_resending() -> None:
    bus = FakeBus()
    bus.answer = (3, accepted)
    client = client_of(bus)
    saga_id = await client.start("refund", order_id="A-17", params=PARAMS, answer_within_s=5)
    assert len(bus.sent) == 3
    assert client.last_reply is not None and client.last_reply.saga_id == saga_id
    await asyncio.sleep(0.2)
    assert len(bus.sent) == 3  # nothing after the answer


async def test_a_refusal_is_command_rejected_with_its_reason() -> None:
    bus = FakeBus()
    bus.answer = (1, lambda command: accepted(command, "command.rejected", reason="not yours"))
    with pytest.raises(CommandRejected, match="not yours"):
        await client_of(bus).abort("s-1", order_id="A-1", reason="stop", answer_within_s=5)
    assert len(bus.sent) == 1


async def test_the_answer_of_another_command_under_the_same_id_is_not_taken() -> None:
    bus = FakeBus()
    bus.answer = (1, lambda command: accepted(command, command_type="saga.start"))
    with pytest.raises(MessageIdReused, match=r"message id m-1 was used before, for saga\.start"):
        await client_of(bus).abort("s-1", order_id="A-1", reason="x", message_id="m-1",
                                   answer_within_s=5)  # fmt: skip
    bus = FakeBus()
    bus.answer = (1, lambda command: accepted(command, saga_id="s-other"))
    with pytest.raises(MessageIdReused, match="saga s-other"):
        await client_of(bus).start("refund", order_id="A-1", params=PARAMS, answer_within_s=5)


async def test_a_publish_never_confirmed_may_be_queued_and_the_bound_holds() -> None:
    bus = FakeBus(never_confirmed)
    began = time.monotonic()
    with pytest.raises(NotAnswered) as caught:
        await client_of(bus).start("refund", order_id="A-1", params=PARAMS, saga_id="s-1",
                                   answer_within_s=0.3)  # fmt: skip
    assert time.monotonic() - began < 1.0
    assert len(bus.sent) == 1 and caught.value.sends == 1
    assert not caught.value.queued
    said = str(caught.value)
    assert "RabbitMQ did not confirm it" in said and "may be queued" in said
    assert "may have been lost" in said and "same message id" in said


async def test_a_publish_written_then_cut_off_may_be_queued() -> None:
    async def cut_off(number: int) -> None:
        raise ConnectionResetError("connection reset by peer")

    bus = FakeBus(cut_off)
    with pytest.raises(NotAnswered) as caught:
        await client_of(bus).resume("s-1", order_id="A-1", answer_within_s=0.2)
    assert caught.value.sends == len(bus.sent) >= 2
    assert not caught.value.queued


async def test_nothing_written_is_broker_unreachable_naming_the_url_without_password() -> None:
    async def closed(number: int) -> None:
        raise aiormq.exceptions.ChannelInvalidStateError("<Channel 1> closed")

    bus = FakeBus(closed)
    with pytest.raises(BrokerUnreachable) as caught:
        await client_of(bus).start("refund", order_id="A-1", params=PARAMS, message_id="m-9",
                                   answer_within_s=0.2)  # fmt: skip
    assert len(bus.sent) >= 2  # tried again on the schedule
    said = str(caught.value)
    assert "broker.example:5672" in said and "s3cret" not in said
    assert "nothing was sent, so nothing will happen" in said
    assert caught.value.facts()["message_id"] == "m-9"
    assert not isinstance(caught.value, TimeoutError)


async def test_a_connection_that_is_down_sends_nothing() -> None:
    bus = FakeBus()
    bus.connection.connected.clear()
    began = time.monotonic()
    with pytest.raises(BrokerUnreachable, match="the connection to RabbitMQ is down"):
        await client_of(bus).approve("s-1", order_id="A-1", answer_within_s=0.2)
    assert bus.sent == []
    assert time.monotonic() - began < 1.0


async def test_nacks_are_broker_unreachable_the_broker_took_no_copy() -> None:
    async def nacked(number: int) -> None:
        raise aiormq.exceptions.DeliveryError(None, pamqp.commands.Basic.Nack(number))

    bus = FakeBus(nacked)
    with pytest.raises(BrokerUnreachable) as caught:
        await client_of(bus).reject("s-1", order_id="A-1", reason="no", answer_within_s=0.2)
    said = str(caught.value)
    assert "did not take saga.reject of saga s-1" in said and "refused it" in said


async def test_an_unroutable_command_fails_at_once() -> None:
    async def returned(number: int) -> None:
        frame = pamqp.commands.Basic.Return(312, "NO_ROUTE", "saga.commands", "dlq.replay.2")
        raise aiormq.exceptions.DeliveryError(None, frame)

    bus = FakeBus(returned)
    with pytest.raises(aiormq.exceptions.DeliveryError, match="NO_ROUTE"):
        await client_of(bus).resolve("s-1", order_id="A-1", note="done", answer_within_s=5)
    assert len(bus.sent) == 1


async def test_a_fault_that_is_not_the_transport_s_is_raised_not_sent_again() -> None:
    async def broken(number: int) -> None:
        raise TypeError("a bug")

    bus = FakeBus(broken)
    with pytest.raises(TypeError, match="a bug"):
        await client_of(bus).start("refund", order_id="A-1", params=PARAMS, answer_within_s=5)
    assert len(bus.sent) == 1


# --- addressing and message ids -----------------------------------------------------------------


async def test_desk_commands_go_to_the_intake_under_their_bare_type_even_naming_an_order() -> None:
    bus = FakeBus()
    bus.answer = (1, lambda c: DeskReply(type="desk.done", command_id=c.message_id,
                                         command_type=c.type))  # fmt: skip
    await client_of(bus).replay_dead_letters(order_id="A-17", message_id="m-r")
    bus.answer = (2, lambda c: DeskReply(type="desk.done", command_id=c.message_id,
                                         command_type=c.type))  # fmt: skip
    await client_of(bus).discard_dead_letter(3, reason="junk", message_id="m-d")
    assert [(key, message.message_id) for _, key, message in bus.sent] == [
        ("dlq.replay", "m-r"), ("dlq.discard", "m-d"),
    ]  # fmt: skip
    assert {exchange for exchange, _, _ in bus.sent} == {bus.topology.commands_exchange}


async def test_every_command_takes_the_message_id_it_is_given() -> None:
    bus = FakeBus()
    client = client_of(bus)
    sends: list[Callable[[str], Awaitable[object]]] = [
        lambda m: client.start("refund", order_id="A-1", params=PARAMS, message_id=m),
        lambda m: client.abort("s-1", order_id="A-1", reason="r", message_id=m),
        lambda m: client.resume("s-1", order_id="A-1", message_id=m),
        lambda m: client.resolve("s-1", order_id="A-1", note="n", message_id=m),
        lambda m: client.approve("s-1", order_id="A-1", message_id=m),
        lambda m: client.reject("s-1", order_id="A-1", reason="r", message_id=m),
        lambda m: client.status("s-1", order_id="A-1", message_id=m),
        lambda m: client.replay_dead_letters(order_id="A-1", message_id=m),
        lambda m: client.discard_dead_letter(1, reason="r", message_id=m),
    ]
    for number, send in enumerate(sends, start=1):
        bus.answer = (number, _answer_for)
        await send(f"m-{number}")
    assert [message.message_id for _, _, message in bus.sent] == [
        f"m-{n}" for n in range(1, len(sends) + 1)
    ]
    ids = {message.message_id for message in (await _two_starts(client_of(FakeBus())))}
    assert len(ids) == 2  # without one, each command gets a fresh id


def _answer_for(command: Any) -> CommandReply | DeskReply:
    if command.type.startswith("dlq."):
        return DeskReply(type="desk.done", command_id=command.message_id,
                         command_type=command.type)  # fmt: skip
    return accepted(command, saga_register={} if command.type == "saga.status" else None)


async def _two_starts(client: SagaClient) -> list[Outbound]:
    bus = cast(FakeBus, client.bus)
    for number in (1, 2):
        bus.answer = (number, _answer_for)
        await client.start("refund", order_id="A-1", params=PARAMS)
    return [message for _, _, message in bus.sent]


async def test_the_client_default_bound_applies_when_a_call_gives_none() -> None:
    bus = FakeBus()
    client = client_of(bus, answer_within_s=0.2)
    began = time.monotonic()
    with pytest.raises(NotAnswered) as caught:
        await client.status("s-1", order_id="A-1")
    assert time.monotonic() - began < 1.0
    assert caught.value.within_s == 0.2
    assert "a query changes nothing" in str(caught.value).lower()
