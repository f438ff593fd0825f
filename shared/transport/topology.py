"""Every exchange and queue, named from one namespace and declared idempotently at start.

Ordering per order comes from the application, not the broker: ``crc32(order_id) % N`` picks one
of N quorum queues with a single active consumer (the consistent-hash exchange may move a key to
another queue after a node restart, so it is not used).

What nothing else remembers travels through quorum queues: commands, settle requests, dead
letters. An action request is remembered by the register (written before it leaves, sent again
by its deadline), so it travels as a transient message through a classic, non-durable queue per
service (``request_queue``): no Raft write, no fsync. Losing such a queue (a broker restart; on a
cluster, its node) loses only requests the deadlines send again; a publish meanwhile comes back
unroutable, and the coordinator declares the queue again and sends once more. An outcome is
remembered by the service's key record (answered again on a resend), so it travels the same way,
through a classic queue per partition (``outcome_queue``) that only the partition's owner
consumes; its exchange's alternate exchange is the partitions exchange, so an outcome whose
queue is gone lands in the quorum partition queue instead of coming back (docs:
explanation/design.md, "Two kinds of queue").
"""

from __future__ import annotations

import contextlib
import functools
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from aio_pika.abc import AbstractChannel, ExchangeType

from saga_shared.config import Settings
from saga_shared.errors import ConfigError
from saga_shared.model.catalog import read_catalog

SERVICES: tuple[str, ...] = ("inventory", "erp", "payments", "email")


def partition_of(order_id: str, partitions: int) -> int:
    # crc32, never hash(): Python salts str hashes per process, so two processes would disagree.
    return zlib.crc32(order_id.encode()) % partitions


def event_patterns(text: str) -> tuple[str, ...]:
    """``SAGA_EVENTS``: comma-separated patterns of event types, e.g. ``saga.*,step.failed``."""
    return tuple(p.strip() for p in text.split(",") if p.strip())


@functools.lru_cache(maxsize=1024)
def _published(event_type: str, patterns: tuple[str, ...]) -> bool:
    # Asked for every event of every decision; the event types are a few dozen.
    return any(fnmatchcase(event_type, pattern) for pattern in patterns)


@dataclass(frozen=True)
class Topology:
    namespace: str
    partitions: int
    delivery_limit: int
    quorum_size: int = 0  # members per queue on a cluster; 0: the broker's default
    # Patterns (fnmatch) of the lifecycle events published; "*": all of them.
    events: tuple[str, ...] = ("*",)
    # The services (one action queue each) are the catalog's; read when first needed, so a
    # client that only sends commands needs no catalog.
    catalog_file: Path | None = None
    declared_services: tuple[str, ...] | None = None  # given: instead of the catalog file's

    @classmethod
    def from_settings(cls, settings: Settings) -> Topology:
        return cls(
            settings.namespace, settings.partitions, settings.delivery_limit,
            settings.quorum_size, events=event_patterns(settings.events),
            catalog_file=settings.catalog_file,
        )  # fmt: skip

    @functools.cached_property
    def services(self) -> tuple[str, ...]:
        if self.declared_services is not None:
            return self.declared_services
        if self.catalog_file is None:
            return SERVICES
        return read_catalog(self.catalog_file).services

    def publishes(self, event_type: str) -> bool:
        return _published(event_type, self.events)

    # --- names ---------------------------------------------------------------------------------
    @property
    def commands_exchange(self) -> str:
        return f"{self.namespace}.commands"

    @property
    def intake_queue(self) -> str:
        return f"{self.namespace}.intake"

    @property
    def partitions_exchange(self) -> str:
        return f"{self.namespace}.partitions"

    def partition_queue(self, index: int) -> str:
        return f"{self.namespace}.partition.{index}"

    def partition_key(self, order_id: str) -> str:
        return str(partition_of(order_id, self.partitions))

    def command_key(self, command_type: str, order_id: str) -> str:
        """How a client publishes a command of an order: straight to its partition."""
        return f"{command_type}.{self.partition_key(order_id)}"

    @property
    def outcomes_exchange(self) -> str:
        """Where services answer: to the order's partition's outcome queue, or, that one gone,
        through the alternate exchange (the partitions exchange) to its quorum queue."""
        return f"{self.namespace}.outcomes"

    def answer_exchange(self, message_type: str) -> str:
        """Where a service publishes an answer: an outcome of a request (done, failed) to the
        outcomes exchange; a settle's answer (``action.settled``) to the partitions exchange, a
        quorum queue's, since a step in doubt has no request whose resend would bring it back."""
        if message_type in ("action.done", "action.failed"):
            return self.outcomes_exchange
        return self.partitions_exchange

    def failure_holds_its_order(self, exchange: str | None) -> bool:
        """Whether a message published to ``exchange`` that failed and will be retried blocks
        its order until it comes back. An outcome does not: it may come back from a classic queue
        that is gone by then, with it (a broker restart), and a block waiting for it would hold
        its order for ever (the 10,000-saga chaos run of 2026-12-07 held 55 orders so). The
        watch's resend brings its answer again, and the register takes an outcome whatever came
        before it of its order: a deadline's resend, an abort, another saga's command."""
        return exchange != self.outcomes_exchange

    def outcome_queue(self, index: int) -> str:
        """A partition's classic queue of outcomes (transient, declared by the coordinators)."""
        return f"{self.namespace}.outcome.{index}"

    @property
    def actions_exchange(self) -> str:
        return f"{self.namespace}.actions"

    def action_queue(self, service: str) -> str:
        """A service's quorum queue: its settle requests (and requests sent before 0.3)."""
        return f"{self.namespace}.action.{service}"

    def request_queue(self, service: str) -> str:
        """A service's classic queue of action requests (transient, declared on every connect)."""
        return f"{self.namespace}.request.{service}"

    @staticmethod
    def request_key(service: str) -> str:
        """The routing key of a service's action requests on the actions exchange."""
        return f"request.{service}"

    def is_request_route(self, exchange: str, routing_key: str) -> bool:
        """Whether a publish goes to a request queue: unroutable, it is sent again, never
        buried (its queue was lost with its node and is being declared again)."""
        return exchange == self.actions_exchange and routing_key.startswith("request.")

    @property
    def events_exchange(self) -> str:
        return f"{self.namespace}.events"

    @property
    def dead_letter_exchange(self) -> str:
        return f"{self.namespace}.dlx"

    @property
    def dead_letter_queue(self) -> str:
        return f"{self.namespace}.dead-letters"

    @property
    def last_resort_queue(self) -> str:
        """Where the ingester puts a dead letter it could not store after its own retries:
        nobody consumes it; ``saga dlq last-resort`` shows what is there."""
        return f"{self.namespace}.dead-letters.last-resort"

    def all_queues(self) -> list[str]:
        return [
            self.intake_queue,
            *(self.partition_queue(i) for i in range(self.partitions)),
            *(self.action_queue(s) for s in self.services),
            *(self.request_queue(s) for s in self.services),
            *(self.outcome_queue(i) for i in range(self.partitions)),
            self.dead_letter_queue,
            self.last_resort_queue,
        ]

    def quorum_queues(self) -> list[str]:
        """Every queue but the request and outcome queues (classic)."""
        return [q for q in self.all_queues() if not self.is_transient_queue(q)]

    def transient_queues(self) -> list[str]:
        """The classic queues a broker restart (on a cluster, their node) deletes: what the
        coordinators' watch looks for (``saga_coordinator.queue_watch``)."""
        return [q for q in self.all_queues() if self.is_transient_queue(q)]

    def kind_of(self, queue: str | None) -> tuple[str, int | str | None]:
        """What a queue of this namespace is: ("intake", None), ("partition", index),
        ("action", service) (its request queue too: the same messages, the same checks), or
        ("other", None). A partition's outcome queue is ("partition", index) too."""
        if queue == self.intake_queue:
            return "intake", None
        for prefix in (f"{self.namespace}.partition.", f"{self.namespace}.outcome."):
            if queue and queue.startswith(prefix) and queue[len(prefix) :].isdigit():
                return "partition", int(queue[len(prefix) :])
        for prefix in (f"{self.namespace}.action.", f"{self.namespace}.request."):
            if queue and queue.startswith(prefix) and len(queue) > len(prefix):
                return "action", queue[len(prefix) :]
        return "other", None

    def is_request_queue(self, queue: str) -> bool:
        return queue.startswith(f"{self.namespace}.request.")

    def is_outcome_queue(self, queue: str) -> bool:
        return queue.startswith(f"{self.namespace}.outcome.")

    def is_transient_queue(self, queue: str) -> bool:
        return self.is_request_queue(queue) or self.is_outcome_queue(queue)

    def all_exchanges(self) -> list[str]:
        return [
            self.commands_exchange,
            self.partitions_exchange,
            self.outcomes_exchange,
            self.actions_exchange,
            self.events_exchange,
            self.dead_letter_exchange,
        ]

    # --- declaration ---------------------------------------------------------------------------
    def _quorum_args(self) -> dict[str, Any]:
        args: dict[str, Any] = {"x-queue-type": "quorum"}
        if self.quorum_size:
            args["x-quorum-initial-group-size"] = self.quorum_size
        return args

    def _work_queue_args(self, *, single_active: bool) -> dict[str, Any]:
        # At-least-once dead-lettering needs all three of strategy, reject-publish overflow and a
        # dead-letter exchange; without any one RabbitMQ silently falls back to at-most-once.
        args: dict[str, Any] = {
            **self._quorum_args(),
            "x-delivery-limit": self.delivery_limit,
            "x-dead-letter-exchange": self.dead_letter_exchange,
            "x-dead-letter-strategy": "at-least-once",
            "x-overflow": "reject-publish",
        }
        if single_active:
            args["x-single-active-consumer"] = True
        return args

    @staticmethod
    def outcome_queue_args() -> dict[str, Any]:
        # Classic as the request queues; one consumer at a time, as the partition queue (the
        # lock holder consumes both; this is the second guard, as there).
        return {"x-queue-type": "classic", "x-single-active-consumer": True}

    def alternates(self) -> dict[str, str]:
        """Each exchange with an alternate exchange: where what it cannot route goes."""
        return {self.outcomes_exchange: self.partitions_exchange}

    def outcomes_exchange_args(self) -> dict[str, Any]:
        return {"alternate-exchange": self.alternates()[self.outcomes_exchange]}

    @staticmethod
    def request_queue_args() -> dict[str, Any]:
        # Classic, stated: a policy or a default queue type must not make it quorum. No
        # dead-letter arguments: a classic queue's dead-lettering is at-most-once and it has no
        # delivery limit, so the adapter counts deliveries and dead-letters itself
        # (saga_shared.transport.poison).
        return {"x-queue-type": "classic"}

    def bindings(self) -> list[tuple[str, str, str]]:
        """Every (exchange, routing key, queue) binding of the work queues: what ``declare``
        binds, and what the in-memory bus routes by."""
        commands, partitions = self.commands_exchange, self.partitions_exchange
        out = [(commands, key, self.intake_queue) for key in ("saga.*", "dlq.*")]
        for index in range(self.partitions):
            queue = self.partition_queue(index)
            out += [(partitions, str(index), queue), (commands, f"saga.*.{index}", queue)]
            out.append((self.outcomes_exchange, str(index), self.outcome_queue(index)))
        out += [(self.actions_exchange, s, self.action_queue(s)) for s in self.services]
        out += [
            (self.actions_exchange, self.request_key(s), self.request_queue(s))
            for s in self.services
        ]
        out.append((self.dead_letter_exchange, "#", self.dead_letter_queue))
        return out

    async def declare(self, channel: AbstractChannel, *, requests: bool = True) -> None:
        """Everything, idempotently; ``requests=False``: not the request and outcome queues (a
        consumer subscribing again leaves them to the coordinator, whose watch must see one gone
        to send again what went with it: ``saga_coordinator.queue_watch``)."""
        commands = await channel.declare_exchange(
            self.commands_exchange, ExchangeType.TOPIC, durable=True
        )
        partitions = await channel.declare_exchange(
            self.partitions_exchange, ExchangeType.DIRECT, durable=True
        )
        actions = await channel.declare_exchange(
            self.actions_exchange, ExchangeType.DIRECT, durable=True
        )
        await channel.declare_exchange(
            self.outcomes_exchange, ExchangeType.DIRECT, durable=True,
            arguments=self.outcomes_exchange_args(),
        )  # fmt: skip
        await channel.declare_exchange(self.events_exchange, ExchangeType.TOPIC, durable=True)
        dlx = await channel.declare_exchange(
            self.dead_letter_exchange, ExchangeType.FANOUT, durable=True
        )

        dead = await channel.declare_queue(
            self.dead_letter_queue, durable=True, arguments=self._quorum_args()
        )
        await dead.bind(dlx)
        await channel.declare_queue(
            self.last_resort_queue, durable=True, arguments=self._quorum_args()
        )

        intake = await channel.declare_queue(
            self.intake_queue, durable=True, arguments=self._work_queue_args(single_active=True)
        )
        # A command under its bare type (``saga.start``, ``dlq.replay``) comes to the intake;
        # under its type and its order's partition (``saga.start.3``), to the partition itself.
        for old in ("#", "saga.#"):  # what earlier versions bound
            await intake.unbind(commands, routing_key=old)
        bindings = self.bindings()
        for _, key, _ in (b for b in bindings if b[2] == self.intake_queue):
            await intake.bind(commands, routing_key=key)

        for index in range(self.partitions):
            queue = await channel.declare_queue(
                self.partition_queue(index),
                durable=True,
                arguments=self._work_queue_args(single_active=True),
            )
            for exchange, key, _ in (b for b in bindings if b[2] == queue.name):
                await queue.bind(commands if exchange == commands.name else partitions, key)
            if requests:
                await self.declare_outcomes(channel, index)

        for service in self.services:
            queue = await channel.declare_queue(
                self.action_queue(service),
                durable=True,
                arguments=self._work_queue_args(single_active=False),
            )
            await queue.bind(actions, routing_key=service)
            if requests:
                await self.declare_requests(channel, service)

    async def declare_requests(self, channel: AbstractChannel, service: str) -> None:
        """A service's request queue: non-durable, so a node that goes down takes it away
        (publishes come back unroutable, and are sent again), where a durable classic queue would
        stay down with its node."""
        with _transient_permitted():
            queue = await channel.declare_queue(
                self.request_queue(service), durable=False, arguments=self.request_queue_args()
            )
        await queue.bind(self.actions_exchange, routing_key=self.request_key(service))

    async def declare_outcomes(self, channel: AbstractChannel, index: int) -> None:
        """A partition's outcome queue: non-durable, as a request queue."""
        with _transient_permitted():
            queue = await channel.declare_queue(
                self.outcome_queue(index), durable=False, arguments=self.outcome_queue_args()
            )
        await queue.bind(self.outcomes_exchange, routing_key=str(index))

    async def delete(self, channel: AbstractChannel) -> None:
        """Remove everything (tests clean up after themselves)."""
        for name in self.all_queues():
            await channel.queue_delete(name)
        for name in self.all_exchanges():
            await channel.exchange_delete(name)


# RabbitMQ 4.3 and later deny queues both non-durable and not exclusive unless a node's
# rabbitmq.conf permits them, and close the whole connection on one (541 INTERNAL_ERROR).
TRANSIENT_DENIED = "transient_nonexcl_queues"
TRANSIENT_PERMIT = "deprecated_features.permit.transient_nonexcl_queues = true"


@contextlib.contextmanager
def _transient_permitted() -> Iterator[None]:
    """A denial of the request and outcome queues, as a line naming the setting, instead of a
    connection the robust client opens again only to be closed again."""
    try:
        yield
    except Exception as exc:
        if TRANSIENT_DENIED not in str(exc):
            raise
        raise ConfigError(
            "RabbitMQ refused the request and outcome queues: they are non-durable and not "
            f"exclusive ({TRANSIENT_DENIED}), which RabbitMQ 4.3 and later deny by default. Add "
            f"`{TRANSIENT_PERMIT}` to rabbitmq.conf on every node and restart them "
            '(see "Install" in the docs)'
        ) from exc
