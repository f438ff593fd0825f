"""A batch queued in one go: what each message gets when no confirm comes, and what a batch
that never reached the channel leaves behind (nothing). The broker's answers (confirms, a
return, a missing exchange) are tested on the real broker in tests/integration/test_bus.py."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Any, cast

import aiormq
import pytest
from pamqp import commands as spec
from pamqp.body import ContentBody

from saga_shared.amqp_internals import batch


class FakeChannel:
    """What ``batch`` touches of aiormq's channel; ``room`` bounds its write queue."""

    number = 1

    def __init__(self, room: int = 10) -> None:
        self.lock = asyncio.Lock()
        self.delivery_tag = 7
        self.confirmations: OrderedDict[int, Any] = OrderedDict()
        self.message_id_delivery_tag: dict[str, int] = {}
        self.write_queue: asyncio.Queue[Any] = asyncio.Queue(room)

    def create_future(self) -> asyncio.Future[Any]:
        return asyncio.get_running_loop().create_future()

    def _split_body(self, body: bytes) -> list[Any]:
        return [ContentBody(body)]


def publishes(count: int) -> list[batch.Publish]:
    return [("ex", "key", b"{}", spec.Basic.Properties(message_id=f"m{i}"), True)
            for i in range(count)]  # fmt: skip


async def test_each_message_gets_its_confirm_or_a_timeout() -> None:
    fake = FakeChannel()
    channel = cast(aiormq.Channel, fake)
    running = asyncio.create_task(batch.publish(channel, publishes(3), confirm_within_s=0.2))
    await asyncio.sleep(0.01)
    assert list(fake.confirmations) == [8, 9, 10]  # one tag each, in order
    assert fake.write_queue.qsize() == 1  # every frame in one item
    fake.message_id_delivery_tag["m1"] = 99  # a later publish of the same id took it over
    fake.confirmations[8].set_result(spec.Basic.Ack(8))
    fake.confirmations[10].set_exception(aiormq.exceptions.DeliveryError(None, spec.Basic.Nack(10)))

    first, second, third = await running

    assert first is None
    assert isinstance(second, TimeoutError)
    assert isinstance(third, aiormq.exceptions.DeliveryError)
    # A return can no longer be matched to them; the later publish keeps its own.
    assert fake.message_id_delivery_tag == {"m1": 99}


async def test_a_batch_cancelled_before_it_reached_the_channel_frees_its_tags() -> None:
    fake = FakeChannel(room=1)
    fake.write_queue.put_nowait("full")
    channel = cast(aiormq.Channel, fake)
    running = asyncio.create_task(batch.publish(channel, publishes(3), confirm_within_s=1))
    await asyncio.sleep(0.01)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running

    assert fake.delivery_tag == 7
    assert fake.confirmations == {} and fake.message_id_delivery_tag == {}
    assert fake.write_queue.qsize() == 1  # only what was there
