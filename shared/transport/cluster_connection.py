"""A robust AMQP connection to a RabbitMQ cluster: the first node that answers, and, whenever
the node in use goes away, the others in turn (the next one first).

aio-pika's ``RobustConnection`` reconnects to the one URL it was given; its reconnection loop
calls one step per attempt (``__connect_transport``), which this class wraps to walk the nodes.
Channels, consumers and their settings are then restored by aio-pika as on any reconnection.
The step is private to aio-pika: ``pyproject.toml`` pins aio-pika below 11, and
``tests/integration/test_cluster.py`` kills the node in use under load."""

from __future__ import annotations

import logging
from typing import Any, ClassVar

import aio_pika
from aio_pika.abc import AbstractRobustConnection
from aio_pika.exceptions import CONNECTION_EXCEPTIONS
from aio_pika.robust_connection import RobustConnection
from yarl import URL

from saga_shared.addresses import one_per_host

log = logging.getLogger(__name__)


class ClusterConnection(RobustConnection):
    NODES: ClassVar[tuple[URL, ...]] = ()

    def __init__(self, url: URL, *args: Any, **kwargs: Any) -> None:
        super().__init__(url, *args, **kwargs)
        self._turn = 0

    async def _RobustConnection__connect_transport(self) -> None:
        failed: BaseException | None = None
        for _ in self.NODES:
            self.url = self.NODES[self._turn % len(self.NODES)]
            self._turn += 1  # the next attempt, or the next reconnection, starts further on
            try:
                await RobustConnection._RobustConnection__connect_transport(self)  # type: ignore[attr-defined]
            except CONNECTION_EXCEPTIONS as exc:
                log.info("broker node %s did not answer: %r", self, exc)
                failed = exc
            else:
                return
        assert failed is not None
        raise failed


async def connect_cluster(url: str, **kwargs: Any) -> AbstractRobustConnection:
    """``aio_pika.connect_robust`` for a URL naming one node or several."""
    nodes = one_per_host(url)
    connection: AbstractRobustConnection
    if len(nodes) == 1:
        connection = await aio_pika.connect_robust(url, **kwargs)
    else:
        named = {"NODES": tuple(URL(n) for n in nodes)}
        cls = type("ClusterConnection", (ClusterConnection,), named)
        connection = await aio_pika.connect_robust(nodes[0], connection_class=cls, **kwargs)
    return connection
