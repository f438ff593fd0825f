"""The adapter of one service: consume its action requests, call its functions, report.

Per request: call the service's function (``services.sdk``) with the request's idempotency key,
retry ``Transient`` errors with bounded exponential backoff, publish ``done`` or ``failed`` into
the order's partition, and only then let the delivery be acked. A redelivered request is
harmless: the system returns the stored outcome and the outcome message has the same id, which
the coordinator's inbox absorbs.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import asyncpg
from aio_pika.abc import AbstractIncomingMessage
from opentelemetry import trace
from pydantic import TypeAdapter
from tenacity import (
    AsyncRetrying,
    before_sleep_log,
    retry_if_exception,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential,
)

from services.errors import Permanent, Transient
from services.outcome import Done, Verdict, build_outcome
from services.registry import load_service
from services.sdk import Resources, Service, batch_scope
from shared import logs, metrics, tracing, trust
from shared.bus import Bus
from shared.catalog import Catalog
from shared.codec import decode_incoming
from shared.config import Settings
from shared.crashpoints import crash_point
from shared.delivery import Alone, BatchVerdict
from shared.errors import RetryLater
from shared.failures import failure_recorder
from shared.identity import Directory
from shared.linger import Linger
from shared.messages import ActionDone, ActionFailed, ActionRequest
from shared.patience import publish_in_hand
from shared.sql import TRANSIENT_DB_ERRORS, is_transient

log = logging.getLogger(__name__)

_REQUEST: TypeAdapter[ActionRequest] = TypeAdapter(ActionRequest)


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
    ) -> None:
        """``bus`` and ``pool`` may be None only for ``perform`` (the test kit); ``sleep``
        waits between retries (the test kit's does not wait)."""
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
        self._resources = contextlib.AsyncExitStack()
        self._deps: Any = None
        self._opened = False

    async def open(self) -> None:
        """Run the service's setup (its clients, pools); ``run`` does it, tests may."""
        if not self._opened:
            resources = Resources(self.settings, self.pool)
            self._deps = await self._resources.enter_async_context(self.service.open(resources))
            self._opened = True

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
        if self.bus is None or self.pool is None:
            raise RuntimeError("an adapter consumes through a bus, with a pool for its failures")
        queue = self.bus.topology.action_queue(self.name)
        log.info("adapter %s consuming %s", self.name, queue)
        await self.bus.consume(
            queue,
            self.handle,
            prefetch=self.settings.adapter_prefetch,
            mode="concurrent",
            # A request's order is not blocked until it is dead-lettered: other requests of the
            # same order do not exist while this one is in flight (one action per saga).
            on_failure=failure_recorder(self.pool, queue, block_order=False),
            batch=self.handle_batch if self.settings.adapter_batch > 1 else None,
            max_batch=self.settings.adapter_batch,
            linger=Linger.from_settings(self.settings),
        )

    def _request(self, message: AbstractIncomingMessage) -> ActionRequest:
        req = decode_incoming(message, _REQUEST, self.settings.max_message_bytes)
        trust.request(self.directory, req, message.user_id, self.name)  # Forged: dead letter
        return req

    async def handle(
        self, message: AbstractIncomingMessage, *, tried: int = 0, landed: bool = False
    ) -> None:
        """One request alone; ``tried``: calls a batch already made for it, which failed
        transiently (the catalog's attempts count them), ``landed`` whether they may have landed."""
        started = time.monotonic()
        req = self._request(message)
        with trace.use_span(self._span(req, message), end_on_exit=True):
            outcome = await self.perform(req, tried, landed)
            crash_point("adapter.before_publish")
            [error] = await self._publish_outcomes([(req, outcome, None)], [message])
            if error is not None:
                # Not confirmed: requeue the request; its stored outcome is published next time.
                raise _unconfirmed(req, error) from error
        _report(req, outcome, started)

    async def handle_batch(self, messages: Sequence[AbstractIncomingMessage]) -> list[BatchVerdict]:
        """The requests that arrived together: one statement for their calls, one confirm round
        for their outcomes. A request whose call failed transiently is retried alone (with
        backoff, counting this call); so is every request of a batch whose statement failed,
        so that one bad request fails alone."""
        started, began = time.monotonic(), time.time_ns()
        verdicts: list[BatchVerdict] = [None] * len(messages)
        valid: list[tuple[int, ActionRequest]] = []
        for i, message in enumerate(messages):
            try:
                valid.append((i, self._request(message)))
            except Exception as exc:
                verdicts[i] = exc
        if not valid:
            return verdicts
        try:
            called = await self._call_batch([req for _, req in valid])
        except Exception as exc:
            log.warning("%s: a batch of %d failed (%r): each alone", self.name, len(valid), exc)
            for i, _ in valid:
                verdicts[i] = Alone()
            return verdicts
        reports: list[tuple[int, ActionRequest, ActionDone | ActionFailed]] = []
        for (i, req), verdict in zip(valid, called, strict=True):
            if isinstance(verdict, Transient):
                alone = functools.partial(self.handle, tried=1, landed=verdict.may_have_landed)
                verdicts[i] = Alone(alone)
            elif isinstance(verdict, Done | Permanent):
                reports.append((i, req, build_outcome(req, verdict, 1)))
            else:  # the function broke, or a bulk call failed for all: each alone
                verdicts[i] = Alone()
        crash_point("adapter.before_publish")
        spans = [self._span(req, messages[i], began) for i, req, _ in reports]
        pairs = zip(reports, spans, strict=True)
        sent = await self._publish_outcomes(
            [(req, out, span) for (_, req, out), span in pairs], messages
        )
        for (i, req, outcome), error, span in zip(reports, sent, spans, strict=True):
            verdicts[i] = None if error is None else _unconfirmed(req, error)
            span.end()
            if error is None:
                _report(req, outcome, started)
        return verdicts

    async def _publish_outcomes(
        self,
        outcomes: list[tuple[ActionRequest, ActionDone | ActionFailed, tracing.Span | None]],
        deliveries: Sequence[AbstractIncomingMessage],
    ) -> list[BaseException | None]:
        """One confirm round for the outcomes, each carrying its request's span (``None``: the
        current one); an outcome the broker cannot take for now keeps its request in hand."""
        assert self.bus is not None
        items = [self.bus.for_partition(out, tracing.headers_of(span)) for _, out, span in outcomes]
        return await publish_in_hand(self.bus, items, deliveries)

    def _span(
        self, req: ActionRequest, message: AbstractIncomingMessage, began: int | None = None
    ) -> tracing.Span:
        """The span of one request, a child of the coordinator span that sent it."""
        spec = self.catalog.actions.get(req.action)
        return tracing.start(
            f"adapter {req.action}", context=tracing.extract(message.headers),
            kind=tracing.SpanKind.CONSUMER, start_time=began,
            attributes=lambda: tracing.attributes(
                req.saga_id, req.order_id, action=req.action, attempt=req.attempt,
                kind=spec.action_class.value if spec else "compensation",
            ),
        )  # fmt: skip

    async def _call_batch(self, reqs: list[ActionRequest]) -> list[Verdict | Exception]:
        """Every request's function at once, in one batch scope: what they submit to a
        ``Coalescer`` together (the simulated systems' statement) goes out as one call. A lone
        request calls in this task, as outside a batch: no task for it, for the timeout or for
        the bulk call, each a turn of the loop on the way to the system and back."""
        await self.open()
        timeout = min(req.timeout_s for req in reqs)
        if len(reqs) == 1:
            async with asyncio.timeout(timeout):
                return [await self._try_in_batch(reqs[0])]
        async with batch_scope(), asyncio.timeout(timeout):
            return await asyncio.gather(*(self._try_in_batch(req) for req in reqs))

    async def _try_in_batch(self, req: ActionRequest) -> Verdict | Exception:
        try:
            return Done(await self.service.call(req, self._deps))
        except Exception as exc:  # Transient, Permanent, or a broken function (then alone)
            return exc

    async def perform(
        self, req: ActionRequest, tried: int = 0, landed: bool = False
    ) -> ActionDone | ActionFailed:
        """Call the system (with retries) and build the outcome to report; no broker I/O.

        While the database is away the message is held and the call retried for ``db_retry_s``:
        an immediate requeue would burn the delivery count in milliseconds and dead-letter a
        perfectly good request during a database restart."""
        holding = AsyncRetrying(
            retry=retry_if_exception(is_transient),
            wait=wait_exponential(multiplier=0.05, max=2.0),
            stop=stop_after_delay(self.db_retry_s),
            before_sleep=before_sleep_log(log, logging.WARNING),
            reraise=True,
        )
        await self.open()
        try:
            async for attempt in holding:
                with attempt:
                    verdict, tries = await self._call_with_retries(req, tried, landed)
        except TRANSIENT_DB_ERRORS as exc:
            if not is_transient(exc):
                raise
            raise RetryLater(f"database unreachable during {req.action}: {exc!r}") from exc
        return build_outcome(req, verdict, tries)

    async def _call_with_retries(
        self, req: ActionRequest, tried: int, landed: bool
    ) -> tuple[Verdict, int]:
        policy = self.catalog.retry_policy(req.action)
        tries = tried
        if tried:  # the backoff the first retry would have waited
            await self.sleep(min(policy.initial_backoff_s * 2 ** (tried - 1), policy.max_backoff_s))
        retrying = AsyncRetrying(
            stop=stop_after_attempt(max(policy.attempts - tried, 1)),
            wait=wait_exponential(multiplier=policy.initial_backoff_s, max=policy.max_backoff_s),
            retry=retry_if_exception_type(Transient),
            sleep=self.sleep,
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    tries += 1
                    try:
                        result = await self._call_once(req, tries)
                    except Transient as exc:
                        landed = landed or exc.may_have_landed
                        raise
        except Transient as exc:
            # Any try that may have landed leaves the effect in doubt, not only the last.
            return Transient(str(exc), may_have_landed=landed), tries
        except Permanent as exc:
            return exc, tries
        return Done(result), tries

    async def _call_once(self, req: ActionRequest, attempt: int) -> dict[str, Any]:
        try:
            call = self.service.call(req, self._deps, attempt=attempt)
            return await asyncio.wait_for(call, req.timeout_s)
        except TimeoutError:
            # The call may still land (a slow commit): that is what effect_unknown reports.
            raise Transient(f"{req.action} gave no answer within {req.timeout_s:g}s") from None


def _unconfirmed(req: ActionRequest, exc: BaseException) -> RetryLater:
    return RetryLater(f"outcome of {req.idempotency_key} not confirmed: {exc!r}")


def _report(req: ActionRequest, outcome: ActionDone | ActionFailed, started: float) -> None:
    """The outcome, once confirmed: a log line and the metrics."""
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
