"""RabbitMQ 4.3 and later deny non-durable, non-exclusive queues by default and close the whole
connection on one: the request and outcome queues' declaration says so in one line naming the
setting that permits them, instead of a connection opened again only to be closed again. (The
broker here is 3.10: the refusal is the one RabbitMQ 4.3's release notes and clients report.)"""

from __future__ import annotations

from typing import Any

import aiormq
import pytest

from saga_shared.config import Settings
from saga_shared.errors import ConfigError
from saga_shared.transport.topology import TRANSIENT_PERMIT, Topology

DENIED = aiormq.exceptions.ConnectionInternalError(
    541,
    "INTERNAL_ERROR - Feature `transient_nonexcl_queues` is deprecated. By default, this "
    "feature is not permitted anymore.",
)


class Queue:
    def __init__(self, name: str) -> None:
        self.name = name

    async def bind(self, *_: Any, **__: Any) -> None:
        return None

    async def unbind(self, *_: Any, **__: Any) -> None:
        return None


class Channel:
    """A 4.3 broker's answers: durable queues and exchanges declared, a transient queue denied
    (``other``: denied with another error instead)."""

    def __init__(self, other: BaseException | None = None) -> None:
        self.other = other
        self.declared: list[str] = []

    async def declare_exchange(self, name: str, *_: Any, **__: Any) -> Queue:
        return Queue(name)

    async def declare_queue(self, name: str, *, durable: bool, **_: Any) -> Queue:
        if not durable:
            raise self.other or DENIED
        self.declared.append(name)
        return Queue(name)


async def test_a_denied_transient_queue_is_one_line_naming_the_setting() -> None:
    topology = Topology.from_settings(Settings())
    with pytest.raises(ConfigError) as raised:
        await topology.declare(Channel())  # type: ignore[arg-type]
    said = str(raised.value)
    assert TRANSIENT_PERMIT in said and "rabbitmq.conf on every node" in said
    assert "RabbitMQ 4.3" in said and "\n" not in said


async def test_the_durable_part_alone_needs_no_permit_and_other_errors_stay_themselves() -> None:
    topology = Topology.from_settings(Settings())
    channel = Channel()
    await topology.declare(channel, requests=False)  # type: ignore[arg-type]  # as a consumer subscribing again
    assert topology.partition_queue(0) in channel.declared
    away = aiormq.exceptions.ConnectionClosed(320, "CONNECTION_FORCED")
    with pytest.raises(aiormq.exceptions.ConnectionClosed):
        await topology.declare(Channel(other=away))  # type: ignore[arg-type]
