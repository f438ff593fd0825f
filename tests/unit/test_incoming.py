"""``saga_shared.amqp_internals.incoming`` builds the very ``IncomingMessage`` aio-pika builds, for
less."""

from __future__ import annotations

import asyncio
import datetime
from typing import Any

import aio_pika.queue
import pytest
from aio_pika.message import IncomingMessage
from aiormq.abc import DeliveredMessage
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands as spec
from pamqp.header import ContentHeader

from saga_shared.amqp_internals import incoming

NO_CHANNEL: Any = None  # aio-pika only keeps it, for the ack
texts = st.one_of(st.none(), st.just(""), st.text(max_size=20))
properties = st.builds(
    spec.Basic.Properties,
    content_type=texts, content_encoding=texts, correlation_id=texts, reply_to=texts,
    message_id=texts, message_type=texts, user_id=texts, app_id=texts,
    headers=st.one_of(st.none(), st.dictionaries(st.text(max_size=8), st.text(max_size=8))),
    delivery_mode=st.sampled_from([None, 1, 2]),
    priority=st.one_of(st.none(), st.integers(0, 255)),
    timestamp=st.one_of(st.none(), st.none(), st.just(datetime.datetime(2026, 1, 1))),
    expiration=st.sampled_from([None, None, "60000"]),
)  # fmt: skip
deliveries = st.builds(
    lambda p, tag, redelivered, exchange, key, body: DeliveredMessage(
        delivery=spec.Basic.Deliver(consumer_tag="c", delivery_tag=tag, redelivered=redelivered,
                                    exchange=exchange, routing_key=key),
        header=ContentHeader(0, len(body), p), body=body, channel=NO_CHANNEL,
    ),
    properties, st.integers(0, 2**63 - 1), st.booleans(),
    st.text(alphabet="abcdefghijklmnopqrstuvwxyz-_.:", max_size=8), st.text(max_size=8),
    st.binary(max_size=16),
)  # fmt: skip


def attributes(message: Any) -> dict[str, Any]:
    """Every slot of every class of ``message``, set or not."""
    names = {name for cls in type(message).__mro__ for name in getattr(cls, "__slots__", ())}
    mangled = {f"_{c.__name__}{n}" if n.startswith("__") else n
               for c in type(message).__mro__ for n in getattr(c, "__slots__", ())}  # fmt: skip
    return {name: getattr(message, name, "(unset)") for name in names | mangled}


@settings(max_examples=300, deadline=None)
@given(deliveries, st.booleans())
def test_the_same_message_as_aio_pikas(delivery: DeliveredMessage, no_ack: bool) -> None:
    ours, theirs = incoming.incoming(delivery, no_ack), IncomingMessage(delivery, no_ack=no_ack)
    assert type(ours) is IncomingMessage
    assert attributes(ours) == attributes(theirs)
    assert (ours.locked, ours.processed) == (theirs.locked, theirs.processed)


def test_a_delivery_of_this_system_takes_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not aio-pika's constructor after all: the comparison above would pass either way."""
    built: list[object] = []
    monkeypatch.setattr(incoming, "_by_aio_pika", lambda *a, **k: built.append(a))
    props = spec.Basic.Properties(content_type="application/json", delivery_mode=2,
                                  message_id="m-1", headers={"x-order-id": "o-1"})  # fmt: skip
    delivery = DeliveredMessage(
        delivery=spec.Basic.Deliver(consumer_tag="c", delivery_tag=7),
        header=ContentHeader(0, 2, props),
        body=b"{}",
        channel=NO_CHANNEL,
    )
    message = incoming.incoming(delivery)
    assert built == []
    assert (message.message_id, message.delivery_tag, message.headers) == (
        "m-1", 7, {"x-order-id": "o-1"},
    )  # fmt: skip


async def test_the_callback_runs_in_the_delivery_task_and_install_puts_aio_pikas_back() -> None:
    seen: list[tuple[str | None, asyncio.Task[Any] | None]] = []

    async def callback(message: Any) -> str:
        seen.append((message.message_id, asyncio.current_task()))
        return "handled"

    delivery = DeliveredMessage(
        delivery=spec.Basic.Deliver(consumer_tag="c", delivery_tag=1),
        header=ContentHeader(0, 0, spec.Basic.Properties(message_id="m-2")), body=b"",
        channel=NO_CHANNEL,
    )  # fmt: skip
    try:
        incoming.install(True)
        assert aio_pika.queue.consumer is incoming.consumer
        assert await aio_pika.queue.consumer(callback, delivery, no_ack=False) == "handled"
        assert seen == [("m-2", asyncio.current_task())]
    finally:
        incoming.install(False)
    assert aio_pika.queue.consumer is incoming.ORIGINAL_CONSUMER
