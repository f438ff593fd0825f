"""A robust AMQP connection to a RabbitMQ cluster: the first node that answers, and, whenever
the node in use goes away, the others in turn (the next one first). Where the walk starts
differs from one connection to the next (``start_offset``), so that the processes of a
deployment, all given the same URL, spread over the nodes instead of all using the first.

aio-pika's ``RobustConnection`` reconnects to the one URL it was given; its reconnection loop
calls one step per attempt (``__connect_transport``), which this class wraps to walk the nodes.
Channels, consumers and their settings are then restored by aio-pika as on any reconnection.
The step is private to aio-pika: ``pyproject.toml`` pins aio-pika below 11, and
``tests/integration/test_cluster.py`` kills the node in use under load."""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Sequence
from typing import Any, ClassVar, TypeVar

import aio_pika
from aio_pika.abc import AbstractRobustConnection
from aio_pika.exceptions import CONNECTION_EXCEPTIONS
from aio_pika.robust_connection import RobustConnection
from aiormq.exceptions import AMQPConnectionError, InvalidFrameError
from pamqp import commands as spec
from yarl import URL

from saga_shared.addresses import one_per_host
from saga_shared.security.identity import user_of_url

log = logging.getLogger(__name__)
T = TypeVar("T")

# The connections this process has made: the next one starts a node further on.
_made = itertools.count()


def start_offset() -> int:
    """Where a new connection starts walking the nodes: the process id, plus the connections
    this process made before it.

    Every process is given the same URL; had they all started at its first node, that node
    would carry every connection and, under the ``client-local`` leader locator, lead every
    queue they declared. The pid differs between the processes of one machine (and between a
    parent and a child it forks, where a counter alone would be copied; on other machines it is
    as good as random), and the count spreads one process's own connections. A test names the
    start it wants instead: ``connect_cluster(start=...)``."""
    return os.getpid() + next(_made)


def in_turn(nodes: Sequence[T], start: int) -> list[T]:
    """``nodes`` from the one at ``start`` (modulo their number) round to the one before it:
    the order a connection starting there tries them in."""
    first = start % len(nodes)
    return [*nodes[first:], *nodes[:first]]


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


class VhostRefused(AMQPConnectionError):
    """The broker closed the connection as it opened it: the URL's virtual host does not exist,
    its user may not use it, or a connection limit is reached. aiormq says only "Expected one
    of ['Connection.OpenOk'], got <Connection.Close object at 0x...>"."""

    def __repr__(self) -> str:  # what the waiting start logs: the sentence, not its tuple
        return f"<VhostRefused: {self}>"


def _refusal(exc: InvalidFrameError, url: str) -> VhostRefused | None:
    """What the broker said, from the ``Connection.Close`` aiormq's message leaves out (it is
    in the traceback, where aiormq compared it with what it expected)."""
    tb = exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame.f_locals.get("frame")
        if isinstance(frame, spec.Connection.Close):
            vhost = URL(url).path[1:] or "/"
            return VhostRefused(
                f"the broker refused to open virtual host {vhost!r} for user "
                f"{user_of_url(url)!r} ({frame.reply_code} {frame.reply_text}): create it, "
                "or give the user its permissions (`saga setup` does both)"
            )
        tb = tb.tb_next
    return None


async def connect_cluster(
    url: str, *, start: int | None = None, **kwargs: Any
) -> AbstractRobustConnection:
    """``aio_pika.connect_robust`` for a URL naming one node or several; with several, the
    node at ``start`` (default: ``start_offset()``) first, then the ones after it, round. A
    virtual host the broker refuses is said as such (``VhostRefused``)."""
    try:
        return await _connect(url, start, **kwargs)
    except InvalidFrameError as exc:
        refused = _refusal(exc, one_per_host(url)[0])
        if refused is None:
            raise
        raise refused from None


async def _connect(url: str, start: int | None, **kwargs: Any) -> AbstractRobustConnection:
    nodes = one_per_host(url)
    connection: AbstractRobustConnection
    if len(nodes) == 1:
        connection = await aio_pika.connect_robust(url, **kwargs)
    else:
        nodes = in_turn(nodes, start_offset() if start is None else start)
        named = {"NODES": tuple(URL(n) for n in nodes)}
        cls = type("ClusterConnection", (ClusterConnection,), named)
        connection = await aio_pika.connect_robust(nodes[0], connection_class=cls, **kwargs)
    return connection
