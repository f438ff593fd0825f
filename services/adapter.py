"""The adapter of one service: consume its action requests, call the system, report the outcome.

Per request: call the simulated system with the request's idempotency key, retry transient
failures with bounded exponential backoff, publish ``done`` or ``failed`` into the order's
partition, and only then let the delivery be acked. A redelivered request is harmless: the system
returns the stored outcome and the outcome message has the same id, which the coordinator's inbox
absorbs.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Sequence

import asyncpg
from aio_pika.abc import AbstractIncomingMessage
from aio_pika.exceptions import AMQPError
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

from services.errors import TransientFailure
from services.outcome import Verdict, build_outcome
from services.registry import system_for
from services.simulated import Stored
from shared import trust
from shared.bus import Bus
from shared.catalog import Catalog
from shared.codec import decode_incoming, message_to_amqp
from shared.config import Settings
from shared.crashpoints import crash_point
from shared.delivery import Alone, BatchVerdict
from shared.errors import RetryLater
from shared.failures import failure_recorder
from shared.identity import Directory
from shared.messages import ActionDone, ActionFailed, ActionRequest
from shared.sql import TRANSIENT_DB_ERRORS, is_transient

log = logging.getLogger(__name__)

_REQUEST: TypeAdapter[ActionRequest] = TypeAdapter(ActionRequest)


class Adapter:
    def __init__(
        self,
        service: str,
        settings: Settings,
        catalog: Catalog,
        bus: Bus,
        pool: asyncpg.Pool,
        *,
        db_retry_s: float = 30.0,
    ) -> None:
        self.service = service
        self.db_retry_s = db_retry_s
        self.system = system_for(service)
        self.settings = settings
        self.catalog = catalog
        self.bus = bus
        self.pool = pool
        self.directory = Directory.from_settings(settings)

    async def run(self) -> None:
        """Consume this service's action queue until cancelled. Requests of different orders are
        independent, so they are handled concurrently."""
        queue = self.bus.topology.action_queue(self.service)
        log.info("adapter %s consuming %s", self.service, queue)
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
        )

    def _request(self, message: AbstractIncomingMessage) -> ActionRequest:
        req = decode_incoming(message, _REQUEST, self.settings.max_message_bytes)
        trust.request(self.directory, req, message.user_id, self.service)  # Forged: dead letter
        return req

    async def handle(self, message: AbstractIncomingMessage, *, tried: int = 0) -> None:
        """One request alone; ``tried``: calls a batch already made for it, which failed
        transiently (the catalog's attempts count them)."""
        req = self._request(message)
        outcome = await self.perform(req, tried)
        crash_point("adapter.before_publish")
        try:
            await self.bus.to_partition(outcome)
        except (AMQPError, ConnectionError, TimeoutError) as exc:
            # Not confirmed: requeue the request; its stored outcome is published next time.
            raise _unconfirmed(req, exc) from exc
        _log_outcome(req, outcome)

    async def handle_batch(self, messages: Sequence[AbstractIncomingMessage]) -> list[BatchVerdict]:
        """The requests that arrived together: one statement for their calls, one confirm round
        for their outcomes. A request whose call failed transiently is retried alone (with
        backoff, counting this call); so is every request of a batch whose statement failed,
        so that one bad request fails alone."""
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
            log.warning("%s: a batch of %d failed (%r): each alone", self.service, len(valid), exc)
            for i, _ in valid:
                verdicts[i] = Alone()
            return verdicts
        reports: list[tuple[int, ActionRequest, ActionDone | ActionFailed]] = []
        for (i, req), verdict in zip(valid, called, strict=True):
            if isinstance(verdict, TransientFailure):
                verdicts[i] = Alone(functools.partial(self.handle, tried=1))
            else:
                reports.append((i, req, build_outcome(req, verdict, 1)))
        crash_point("adapter.before_publish")
        exchange = self.bus.topology.partitions_exchange
        sent = await self.bus.publish_many(
            [
                (exchange, self.bus.topology.partition_key(req.order_id), message_to_amqp(out))
                for _, req, out in reports
            ]
        )
        for (i, req, outcome), error in zip(reports, sent, strict=True):
            verdicts[i] = None if error is None else _unconfirmed(req, error)
            if error is None:
                _log_outcome(req, outcome)
        return verdicts

    async def _call_batch(self, reqs: list[ActionRequest]) -> list[Verdict]:
        timeout = min(req.timeout_s for req in reqs)
        async with self.pool.acquire() as conn:
            return await asyncio.wait_for(self.system.execute_many(conn, reqs), timeout)

    async def perform(self, req: ActionRequest, tried: int = 0) -> ActionDone | ActionFailed:
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
        try:
            async for attempt in holding:
                with attempt:
                    verdict, tries = await self._call_with_retries(req, tried)
        except TRANSIENT_DB_ERRORS as exc:
            if not is_transient(exc):
                raise
            raise RetryLater(f"database unreachable during {req.action}: {exc!r}") from exc
        return build_outcome(req, verdict, tries)

    async def _call_with_retries(self, req: ActionRequest, tried: int) -> tuple[Verdict, int]:
        policy = self.catalog.retry_policy(req.action)
        tries = tried
        if tried:  # the backoff the first retry would have waited
            await asyncio.sleep(
                min(policy.initial_backoff_s * 2 ** (tried - 1), policy.max_backoff_s)
            )
        retrying = AsyncRetrying(
            stop=stop_after_attempt(max(policy.attempts - tried, 1)),
            wait=wait_exponential(multiplier=policy.initial_backoff_s, max=policy.max_backoff_s),
            retry=retry_if_exception_type(TransientFailure),
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    tries += 1
                    stored = await self._call_once(req)
        except TransientFailure as exc:
            return exc, tries
        return stored, tries

    async def _call_once(self, req: ActionRequest) -> Stored:
        async with self.pool.acquire() as conn:
            try:
                return await asyncio.wait_for(self.system.execute_on(conn, req), req.timeout_s)
            except TimeoutError:
                # The call may still land (a slow commit): that is what effect_unknown reports.
                raise TransientFailure(
                    f"{req.action} gave no answer within {req.timeout_s:g}s"
                ) from None


def _unconfirmed(req: ActionRequest, exc: BaseException) -> RetryLater:
    return RetryLater(f"outcome of {req.idempotency_key} not confirmed: {exc!r}")


def _log_outcome(req: ActionRequest, outcome: ActionDone | ActionFailed) -> None:
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
    )
