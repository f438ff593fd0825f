"""The adapter of one service: consume its action requests, call its functions, report.

Per request: claim its idempotency key in the service's key record, call the service's function
(``saga_services.sdk``) with the key, retry ``Transient`` errors with bounded exponential backoff
(each try claimed again: ``saga_services.calls``), store the outcome, publish ``done`` or ``failed``
into the order's partition, and only then let the delivery be acked. A redelivered request is
harmless: the claim returns the stored outcome and the outcome message has the same id, which
the coordinator's inbox absorbs. A settle (``action.settle``) is answered from the key record
(``saga_services.settling``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Annotated, Any, TypeVar

import asyncpg
from aio_pika.abc import AbstractIncomingMessage
from opentelemetry import trace
from pydantic import Field, TypeAdapter
from tenacity import before_sleep_log

from saga_services import settling
from saga_services.calls import Calls, Outcome
from saga_services.errors import Transient
from saga_services.faults import Rehearsal
from saga_services.keys import KeyStore, MemoryKeys, PgKeys
from saga_services.outcome import Running, build_outcome
from saga_services.registry import SYSTEMS, load_service
from saga_services.sdk import Resources, Service
from saga_shared.config import Settings
from saga_shared.crashpoints import crash_point
from saga_shared.errors import RetryLater
from saga_shared.model.catalog import ActionClass, Catalog
from saga_shared.model.ids import random_id
from saga_shared.model.messages import (
    ActionDone,
    ActionFailed,
    ActionRequest,
    ActionSettled,
    SettleRequest,
)
from saga_shared.observability import logs, metrics, tracing
from saga_shared.security import trust
from saga_shared.security.identity import Directory
from saga_shared.storage.sql import TRANSIENT_DB_ERRORS, holding, is_transient
from saga_shared.transport.bus import Bus
from saga_shared.transport.codec import decode_incoming
from saga_shared.transport.delivery import Alone, BatchVerdict
from saga_shared.transport.failures import failure_recorder
from saga_shared.transport.handoff import is_local
from saga_shared.transport.linger import Linger
from saga_shared.transport.patience import publish_in_hand
from saga_shared.transport.poison import PgCounter, Poison

log = logging.getLogger(__name__)
T = TypeVar("T")

Incoming = ActionRequest | SettleRequest
Report = ActionDone | ActionFailed | ActionSettled
_REQUEST: TypeAdapter[Incoming] = TypeAdapter(
    Annotated[ActionRequest | SettleRequest, Field(discriminator="type")]
)


class Adapter:
    def __init__(
        self,
        service: str | Service[Any],
        settings: Settings,
        catalog: Catalog,
        bus: Bus | None,
        pool: asyncpg.Pool | None,
        *,
        db_retry_s: float = 30.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        keys: KeyStore | None = None,
        owner: str | None = None,
        memory: Any = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``bus`` and ``pool`` may be None only for ``perform`` (the test kit); ``sleep``
        waits between retries (the test kit's does not wait); ``keys``: the key record (by
        default ``service_keys`` through ``pool``, in memory without one); ``owner``: this
        process's name on its claims; ``memory``: in-memory stand-ins of the systems' databases
        (``Resources.memory``: the test kit, the simulation); ``clock``: what a claim's lease
        is checked against right before a call."""
        self.service = load_service(service) if isinstance(service, str) else service
        self.service.check(catalog)  # a function missing or misnamed: refuse to start
        self.name = self.service.name
        self.db_retry_s = db_retry_s
        self.settings = settings
        self.catalog = catalog
        self.bus = bus
        self.pool = pool
        self.sleep = sleep
        self.directory = Directory.from_settings(settings)
        self.keys: KeyStore = keys or (
            PgKeys(pool, atomic=self.service.atomic) if pool is not None
            else MemoryKeys(lambda: datetime.now(UTC), atomic=self.service.atomic)
        )  # fmt: skip
        self.owner = owner or f"{self.name}@{socket.gethostname()}:{os.getpid()}:{random_id()[:8]}"
        # The simulated systems apply faults in their own statement; a service of one's own has
        # them applied here, only where asked (a rehearsal, never by default in production).
        rehearse = settings.inject_faults and pool is not None and self.name not in SYSTEMS
        before = Rehearsal(pool).before if rehearse and pool is not None else None
        self.calls = Calls(self.service, self.keys, catalog, self.owner, sleep=sleep,
                           clock=clock, before=before)  # fmt: skip
        self.memory = memory
        self._resources = contextlib.AsyncExitStack()
        self._deps: Any = None
        self._opened = False

    async def open(self) -> None:
        """Run the service's setup (its clients, pools); ``run`` does it, tests may."""
        if not self._opened:
            resources = Resources(self.settings, self.pool, self.keys, memory=self.memory)
            self._deps = await self._resources.enter_async_context(self.service.open(resources))
            self._opened = True
            for action in self.unsettleable():
                log.warning(
                    "%s: %s is irreversible and %s has no status(key) hook: a call cut short "
                    "(its process killed mid-call) stays in doubt until a person settles it",
                    self.name, action, self.name,
                )  # fmt: skip

    def unsettleable(self) -> list[str]:
        """The irreversible actions of this service whose calls cut short cannot be settled
        without a person: no status hook, and effects not atomic with the key record."""
        if self.service.status is not None or self.keys.atomic:
            return []
        return [a for a in self.service.actions if (spec := self.catalog.actions.get(a))
                and spec.action_class is ActionClass.IRREVERSIBLE]  # fmt: skip

    async def aclose(self) -> None:
        await self._resources.aclose()
        self._opened = False

    async def run(self) -> None:
        """Consume this service's action queue until cancelled. Requests of different orders are
        independent, so they are handled concurrently."""
        await self.open()
        try:
            await self._consume()
        finally:
            await self.aclose()

    async def _consume(self) -> None:
        """Both of this service's queues: requests (classic, counted here), and settles and
        requests from before 0.3 (quorum, counted by the broker)."""
        if self.bus is None or self.pool is None:
            raise RuntimeError("an adapter consumes through a bus, with a pool for its failures")
        bus, pool = self.bus, self.pool
        requests = bus.topology.request_queue(self.name)
        poison = Poison(requests, self.settings.delivery_limit, PgCounter(pool),
                        functools.partial(bus.publish_raw, mandatory=True),
                        bus.topology.dead_letter_exchange)  # fmt: skip
        queues = ((bus.topology.action_queue(self.name), None), (requests, poison))
        log.info("adapter %s consuming %s", self.name, ", ".join(q for q, _ in queues))
        async with asyncio.TaskGroup() as group:
            for queue, guard in queues:
                group.create_task(bus.consume(
                    queue,
                    self.handle,
                    prefetch=self.settings.adapter_prefetch,
                    mode="concurrent",
                    # A request's order is not blocked until it is dead-lettered: other
                    # requests of the same order do not exist while this one is in flight
                    # (one action per saga).
                    on_failure=failure_recorder(pool, queue, block_order=False),
                    batch=self.handle_batch if self.settings.adapter_batch > 1 else None,
                    max_batch=self.settings.adapter_batch,
                    linger=Linger.from_settings(self.settings),
                    poison=guard,
                ))  # fmt: skip

    def _request(self, message: AbstractIncomingMessage) -> Incoming:
        req = decode_incoming(message, _REQUEST, self.settings.max_message_bytes)
        trust.request(self.directory, req, message.user_id, self.name)  # Forged: dead letter
        return req

    async def handle(
        self, message: AbstractIncomingMessage, *, retry: bool = False, landed: bool = False
    ) -> None:
        """One request (or settle) alone; ``retry``: a batch tried it already, which failed
        transiently, ``landed`` whether that try may have landed."""
        started = time.monotonic()
        req = self._request(message)
        with trace.use_span(self._span(req, message), end_on_exit=True):
            if isinstance(req, SettleRequest):
                report: Report | None = await self.settle(req)
            else:
                async with self.calls.holding([req.idempotency_key]):
                    report = await self.perform(req, retry=retry, landed=landed)
            if report is None:  # another process is calling it: its answer is the answer
                _running(req)
                return
            crash_point("adapter.before_publish")
            [error] = await self._publish_outcomes([(req, report, None)], [message], [message])
            if error is not None:
                # Not confirmed: requeue the request; its stored outcome is published next time.
                raise _unconfirmed(req, error) from error
        _report(req, report, started)

    async def settle(self, req: SettleRequest) -> ActionSettled:
        """Which way the key went, from the key record (held while the database is away)."""
        await self.open()
        return await self._holding_db(
            lambda: settling.answer(req, self.service, self.keys, self._deps), req.action
        )

    async def handle_batch(self, messages: Sequence[AbstractIncomingMessage]) -> list[BatchVerdict]:
        """The requests that arrived together: one claim statement, one call statement, one
        store statement, one confirm round for their outcomes. A request whose call failed
        transiently is retried alone (with backoff; its claim counts this try); so is every
        request of a batch that failed as a whole, a settle, and a key this process is already
        working on, so that one bad or slow request fails alone."""
        started, began = time.monotonic(), time.time_ns()
        verdicts: list[BatchVerdict] = [None] * len(messages)
        valid: list[tuple[int, ActionRequest]] = []
        keys: set[str] = set()
        for i, message in enumerate(messages):
            try:
                req = self._request(message)
            except Exception as exc:
                verdicts[i] = exc
                continue
            key = req.idempotency_key
            if isinstance(req, SettleRequest) or key in keys or self.calls.busy_here(key):
                verdicts[i] = Alone()
            else:
                keys.add(key)
                valid.append((i, req))
        if not valid:
            return verdicts
        try:
            await self.open()
            async with self.calls.holding(list(keys)):
                called = await self.calls.batch([req for _, req in valid], self._deps)
        except Exception as exc:
            log.warning("%s: a batch of %d failed (%r): each alone", self.name, len(valid), exc)
            for i, _ in valid:
                verdicts[i] = Alone()  # their claims count this try
            return verdicts
        reports: list[tuple[int, ActionRequest, ActionDone | ActionFailed]] = []
        for (i, req), result in zip(valid, called, strict=True):
            if isinstance(result, Outcome):
                report = self._outcome(req, result)
                if report is None:
                    _running(req)  # acked: the holder of its claim answers
                else:
                    reports.append((i, req, report))
            else:  # transient, or the function broke: alone, its claim counting this try
                landed = not isinstance(result, Transient) or result.may_have_landed
                verdicts[i] = Alone(functools.partial(self.handle, retry=True, landed=landed))
        crash_point("adapter.before_publish")
        spans = [self._span(req, messages[i], began) for i, req, _ in reports]
        pairs = zip(reports, spans, strict=True)
        sent = await self._publish_outcomes(
            [(req, out, span) for (_, req, out), span in pairs], messages,
            [messages[i] for i, _, _ in reports],
        )  # fmt: skip
        for (i, req, outcome), error, span in zip(reports, sent, spans, strict=True):
            verdicts[i] = None if error is None else _unconfirmed(req, error)
            span.end()
            if error is None:
                _report(req, outcome, started)
        return verdicts

    async def _publish_outcomes(
        self,
        outcomes: Sequence[tuple[Incoming, Report, tracing.Span | None]],
        deliveries: Sequence[AbstractIncomingMessage],
        requests: Sequence[AbstractIncomingMessage],
    ) -> list[BaseException | None]:
        """One confirm round for the outcomes, each carrying its request's span (``None``: the
        current one); an outcome the broker cannot take for now keeps its request in hand
        (``deliveries``: the ones in hand). An outcome may be handed over in this process only
        when its request (of ``requests``, one per outcome) was: a first send. One answering
        a resend goes through the broker, which counts its deliveries."""
        assert self.bus is not None
        items = [self.bus.for_outcome(out, tracing.headers_of(span)) for _, out, span in outcomes]
        local = [is_local(request) for request in requests]
        return await publish_in_hand(self.bus, items, deliveries, local=local)

    def _span(
        self, req: Incoming, message: AbstractIncomingMessage, began: int | None = None
    ) -> tracing.Span:
        """The span of one request, a child of the coordinator span that sent it."""
        spec = self.catalog.actions.get(req.action)
        return tracing.start(
            f"adapter {req.action}", context=tracing.extract(message.headers),
            kind=tracing.SpanKind.CONSUMER, start_time=began,
            attributes=lambda: tracing.attributes(
                req.saga_id, req.order_id, action=req.action, attempt=req.attempt,
                kind=("settle" if isinstance(req, SettleRequest)
                      else spec.action_class.value if spec else "compensation"),
            ),
        )  # fmt: skip

    async def perform(
        self, req: ActionRequest, *, retry: bool = False, landed: bool = False
    ) -> ActionDone | ActionFailed | None:
        """Claim and call (with retries) and build the outcome to report; no broker I/O.
        None: another live process holds the key's claim and is calling it (its answer is the
        answer: a resend that finds the send before it still running is not doubt)."""
        await self.open()
        outcome = await self._holding_db(
            lambda: self.calls.alone(req, self._deps, retry=retry, landed=landed), req.action
        )
        return self._outcome(req, outcome)

    def _outcome(self, req: ActionRequest, outcome: Outcome) -> ActionDone | ActionFailed | None:
        if isinstance(outcome.verdict, Running):
            return None
        return build_outcome(req, outcome.verdict, outcome.attempt, outcome.forward)

    async def _holding_db(self, work: Callable[[], Awaitable[T]], action: str) -> T:
        """While the database is away the message is held and ``work`` retried for
        ``db_retry_s``: an immediate requeue would burn the delivery count in milliseconds and
        dead-letter a perfectly good request during a database restart."""
        warned = before_sleep_log(log, logging.WARNING)
        try:
            async for attempt in holding(self.db_retry_s, before_sleep=warned):
                with attempt:
                    return await work()
        except TRANSIENT_DB_ERRORS as exc:
            if not is_transient(exc):
                raise
            raise RetryLater(f"database unreachable during {action}: {exc!r}") from exc
        raise AssertionError("unreachable")  # pragma: no cover


def _unconfirmed(req: Incoming, exc: BaseException) -> RetryLater:
    return RetryLater(f"outcome of {req.idempotency_key} not confirmed: {exc!r}")


def _running(req: Incoming) -> None:
    metrics.REQUESTS_RUNNING_ELSEWHERE.labels(req.action).inc()
    log.info("%s saga=%s key=%s send %d: running in another process, which answers",
             req.action, req.saga_id, req.idempotency_key, req.attempt,
             extra=logs.context(saga_id=req.saga_id, order_id=req.order_id,
                                action=req.action, message_id=req.message_id))  # fmt: skip


def _report(req: Incoming, outcome: Report, started: float) -> None:
    """The outcome, once confirmed: a log line and the metrics."""
    if isinstance(req, SettleRequest) or isinstance(outcome, ActionSettled):
        log.info("%s saga=%s key=%s settle %d -> %s %s", req.action, req.saga_id,
                 req.idempotency_key, req.attempt, getattr(outcome, "verdict", "?"),
                 getattr(outcome, "reason", ""),
                 extra=logs.context(saga_id=req.saga_id, order_id=req.order_id,
                                    action=req.action, message_id=req.message_id))  # fmt: skip
        return
    kind = "done" if isinstance(outcome, ActionDone) else "failed"
    metrics.STEP_SECONDS.labels(req.action, req.phase, kind).observe(time.monotonic() - started)
    if req.phase == "compensation":
        metrics.COMPENSATIONS.labels(req.action, kind).inc()
    if outcome.tries > 1:
        metrics.RETRIES.labels(req.action).inc(outcome.tries - 1)
    log.info(
        "%s saga=%s order=%s key=%s attempt=%d -> %s after %d tries%s",
        req.action,
        req.saga_id,
        req.order_id,
        req.idempotency_key,
        req.attempt,
        outcome.type,
        outcome.tries,
        f": {outcome.reason}" if isinstance(outcome, ActionFailed) else "",
        extra=logs.context(
            saga_id=req.saga_id,
            order_id=req.order_id,
            action=req.action,
            message_id=req.message_id,
        ),
    )
