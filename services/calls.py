"""Calls of one service's functions under claims of its key record (``saga_services.keys``).

Every try is claimed just before it is made: the claim raises the key's attempt number (so a
crash, a batch re-run and a resend all count against the catalog's attempts for that send),
renews the lease, and refuses what must not run (a key fenced by a settle, one another live
process holds, one whose attempts are spent). The lease is checked again, locally, right before
the call: a process frozen between its claim and its call does not call once its lease is over,
since a settle may have fenced the key meanwhile. After the call the outcome is stored (one
statement for a batch), unless the system stored it itself in the key's row with its effect
(an atomic service's done call), or the claim given up (``released``) when the call may have
landed without an answer, so that a settle sees it expired. A compensation first settles its
forward key (fencing it when nobody claimed it), which tells which way a forward call in doubt
went.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from saga_services import settling
from saga_services.errors import Permanent, Transient
from saga_services.keys import Claiming, Finished, KeyStore, Ticket
from saga_services.outcome import Done, Running, Verdict
from saga_services.sdk import KeyQuery, Result, Service, batch_scope, recording
from saga_shared.model.catalog import Catalog
from saga_shared.model.messages import ActionRequest, SettleVerdict

log = logging.getLogger(__name__)

# A lease covers the call's own deadline plus this: a settle never fences a claim whose call
# may still be running.
LEASE_MARGIN_S = 2.0


class Calls:
    def __init__(
        self,
        service: Service[Any],
        keys: KeyStore,
        catalog: Catalog,
        owner: str,
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
        before: Callable[[ActionRequest], Awaitable[None]] | None = None,
    ) -> None:
        """``before``: what runs right before each call (``faults.Rehearsal``)."""
        self.service = service
        self.before = before
        self.keys = keys
        self.catalog = catalog
        self.owner = owner
        self.sleep = sleep
        self.clock = clock
        # Keys this process is working on (their lock, and how many tasks hold or want it): a
        # second delivery of one waits for the first.
        self._mine: dict[str, tuple[asyncio.Lock, int]] = {}

    def claiming(self, req: ActionRequest) -> Claiming:
        policy = self.catalog.retry_policy(req.action)
        return Claiming(req.idempotency_key, req.action, req.order_id, req.attempt,
                        policy.attempts, req.timeout_s + LEASE_MARGIN_S)  # fmt: skip

    def busy_here(self, key: str) -> bool:
        return key in self._mine

    @contextlib.asynccontextmanager
    async def holding(self, keys: Sequence[str]) -> AsyncIterator[None]:
        """Hold ``keys`` for this process (waiting for any held by another of its tasks)."""
        held: list[str] = []
        try:
            for key in sorted(set(keys)):
                lock, users = self._mine.get(key, (asyncio.Lock(), 0))
                self._mine[key] = (lock, users + 1)  # counted before waiting: kept meanwhile
                try:
                    await lock.acquire()
                except BaseException:
                    self._let_go(key, release=False)
                    raise
                held.append(key)
            yield
        finally:
            for key in held:
                self._let_go(key, release=True)

    def _let_go(self, key: str, *, release: bool) -> None:
        lock, users = self._mine[key]
        if release:
            lock.release()
        if users == 1:
            del self._mine[key]
        else:
            self._mine[key] = (lock, users - 1)

    # --- a batch: one claim, the calls together, one store -----------------------------------

    async def batch(self, reqs: Sequence[ActionRequest], deps: Any) -> list[Outcome | Exception]:
        """One try of each request: claimed in one statement, called together (what they submit
        to a ``Coalescer`` goes out as one call), their outcomes stored in one statement. A
        transient failure or a broken function is returned as the exception: the caller
        retries it alone, and that claim counts this try."""
        async with asyncio.timeout(min(req.timeout_s for req in reqs)):  # waits on held keys
            tickets = await self.keys.claim(self.service.name, self.owner,
                                            [self.claiming(r) for r in reqs])  # fmt: skip
        results: list[Outcome | Exception | None] = [None] * len(reqs)
        calls: list[tuple[int, ActionRequest, Ticket, float]] = []
        started = self.clock()
        for i, (req, ticket) in enumerate(zip(reqs, tickets, strict=True)):
            if ticket.kind == "call":
                calls.append((i, req, ticket, started))
            else:
                results[i] = await self._refused(req, ticket)
        for (i, _, _, _), verdict in zip(calls, await self._together(calls, deps), strict=True):
            results[i] = verdict  # an Outcome at its ticket's attempt, or the exception
        await self.keys.finish(self.owner, [
            _finished(req.idempotency_key, out.verdict) if isinstance(out, Outcome)
            else Finished(req.idempotency_key, "returned", landed=True)
            for req, out in zip(reqs, results, strict=True)
            if (isinstance(out, Outcome) and out.called and not out.recorded)
            or (out is not None and not isinstance(out, Outcome | Transient))
        ])  # fmt: skip
        return [r if r is not None else RuntimeError("no verdict") for r in results]

    async def _together(
        self, calls: list[tuple[int, ActionRequest, Ticket, float]], deps: Any
    ) -> list[Outcome | Exception]:
        if not calls:
            return []
        timeout = min(req.timeout_s for _, req, _, _ in calls)
        if len(calls) == 1:  # alone: no batch scope, no task (each a turn of the loop)
            _, req, ticket, started = calls[0]
            async with asyncio.timeout(timeout):
                return [await self._try(req, ticket, started, deps)]
        async with batch_scope(), asyncio.timeout(timeout):
            return await asyncio.gather(
                *(self._try(req, ticket, started, deps) for _, req, ticket, started in calls)
            )

    async def _try(
        self, req: ActionRequest, ticket: Ticket, claimed_at: float, deps: Any
    ) -> Outcome | Exception:
        try:
            forward = await self._forward_state(req, deps)
            self._check_lease(ticket, claimed_at)
            if self.before is not None:
                await self.before(req)
            with recording() as recorded:
                result = await self.service.call(req, deps, attempt=ticket.attempt)
            return self._done(result, ticket, forward, recorded[0])
        except Permanent as exc:
            return Outcome(exc, ticket.attempt)
        except Exception as exc:  # Transient, or a broken function: the caller retries alone
            return exc

    # --- alone, with retries -----------------------------------------------------------------

    async def alone(self, req: ActionRequest, deps: Any, *, retry: bool, landed: bool) -> Outcome:
        """The request's tries from here on, each claimed; ``retry``: a try was made already (in
        a batch), so the first waits the backoff a retry would; ``landed``: it may have landed."""
        policy = self.catalog.retry_policy(req.action)
        if retry:
            await self.sleep(policy.initial_backoff_s)
        retrying = AsyncRetrying(
            stop=stop_after_attempt(policy.attempts), retry=retry_if_exception_type(Transient),
            wait=wait_exponential(multiplier=policy.initial_backoff_s, max=policy.max_backoff_s),
            sleep=self.sleep, reraise=True,
        )  # fmt: skip
        tries = 0
        try:
            async for trial in retrying:
                with trial:
                    tries += 1
                    try:
                        outcome = await self._once(req, deps)
                    except Transient as exc:
                        landed = landed or exc.may_have_landed
                        raise
        except Transient as exc:
            outcome = Outcome(Transient(str(exc), may_have_landed=landed), tries)
        except Permanent as exc:
            outcome = Outcome(exc, tries)
        if outcome.called and not outcome.recorded:
            await self.keys.finish(self.owner, [_finished(req.idempotency_key, outcome.verdict)])
        # The key record's count, or this process's when a claim never came through.
        outcome.attempt = max(outcome.attempt, tries)
        return outcome

    async def _once(self, req: ActionRequest, deps: Any) -> Outcome:
        """One try: its claim (which may wait for a concurrent call holding the key), the
        forward key's settle for a compensation, and the call, within the call's timeout."""
        try:
            async with asyncio.timeout(req.timeout_s):
                claimed_at = self.clock()
                [ticket] = await self.keys.claim(self.service.name, self.owner,
                                                 [self.claiming(req)])  # fmt: skip
                if ticket.kind != "call":
                    return await self._refused(req, ticket)
                try:
                    forward = await self._forward_state(req, deps)
                    self._check_lease(ticket, claimed_at)
                    if self.before is not None:
                        await self.before(req)
                    with recording() as recorded:
                        result = await self.service.call(req, deps, attempt=ticket.attempt)
                except Permanent as exc:
                    return Outcome(exc, ticket.attempt)
                except (Transient, TimeoutError):
                    raise
                except Exception:
                    # The function broke (a bug, a missing table): the try is given back, and
                    # the delivery limit, not the attempts, bounds its message.
                    returned = Finished(req.idempotency_key, "returned", landed=True)
                    await self.keys.finish(self.owner, [returned])
                    raise
        except TimeoutError:
            # The call may still land (a slow commit): that is what effect_unknown reports.
            raise Transient(f"{req.action} gave no answer within {req.timeout_s:g}s") from None
        return self._done(result, ticket, forward, recorded[0])

    def _done(
        self, result: Result, ticket: Ticket, forward: SettleVerdict | None, recorded: bool
    ) -> Outcome:
        """A call that answered; ``recorded``: its system said it stored the outcome in the
        key's row, which counts only where that row is the SDK's own (an atomic record)."""
        return Outcome(Done(result), ticket.attempt, forward,
                       recorded=recorded and self.keys.atomic)  # fmt: skip

    async def _refused(self, req: ActionRequest, ticket: Ticket) -> Outcome:
        """What a claim that refused a call comes to, reported without calling. A report that
        says nothing landed must stay true: where the record is atomic with the effect, the
        key of spent attempts is settled (fenced unless it is done meanwhile) first, since a
        later send may hold it and still be calling."""
        if ticket.kind == "spent" and self.keys.atomic:
            state = await self.keys.settle(req.idempotency_key, self.service.name, req.action,
                                           req.order_id)  # fmt: skip
            if state.found == "done":
                return Outcome(Done(state.result or {}), ticket.attempt, called=False)
            if state.found in ("failed", "fenced"):
                why = f"the attempts of send {req.attempt} are used up; its key is {state.found}"
                reason = f"{why}: {state.error}" if state.error else why
                return Outcome(Permanent(reason, may_have_landed=state.landed), ticket.attempt,
                               called=False)  # fmt: skip
        verdict = _refusal(ticket, self.keys.atomic)
        if ticket.kind == "spent" and ticket.owner == self.owner:
            # This process's own claim, its tries used up: given up, so a settle or a
            # compensation finds it expired rather than waiting out its lease.
            released = Finished(req.idempotency_key, "released", landed=True)
            await self.keys.finish(self.owner, [released])
        return Outcome(verdict, ticket.attempt, called=False)

    def _check_lease(self, ticket: Ticket, claimed_at: float) -> None:
        lease = ticket.lease_s or 0.0
        if self.clock() > claimed_at + lease:
            raise Permanent(
                f"not called: the claim's lease ({lease:g}s) ran out before the call, so a "
                "settle may have fenced the key", may_have_landed=ticket.landed,
            )  # fmt: skip

    async def _forward_state(self, req: ActionRequest, deps: Any) -> SettleVerdict | None:
        """A compensation's forward key, settled first: fenced when nobody claimed it (or,
        atomic, nobody finished it; or its claim expired), so no late forward call lands after
        the compensation. What it held tells which way a forward call in doubt went."""
        forward_key = req.params.get("forward_key") if req.phase == "compensation" else None
        action = self._forward_action(req.action, forward_key)
        if not isinstance(forward_key, str) or action is None:
            return None
        query = KeyQuery(forward_key, action, req.order_id)
        why = f"fenced: {req.action} ({req.idempotency_key}) undoes it"
        state, _, abandoned = await settling.look(query, self.service, self.keys, deps, fence=why)
        if state.found == "running" and (state.lease_s or 0) < req.timeout_s:
            # The forward call may still answer: wait its lease out (within this try's time)
            # rather than spend the compensation's tries while it runs.
            await self.sleep((state.lease_s or 0) + 0.01)
            state, _, abandoned = await settling.look(query, self.service, self.keys, deps,
                                                      fence=why)  # fmt: skip
        if state.found == "running":
            raise Transient(
                f"{action} is still being called under {forward_key} (claimed by {state.owner}, "
                f"{state.lease_s or 0:.1f}s of its lease left): undo it once it has answered",
                may_have_landed=False,
            )  # fmt: skip
        if abandoned or state.found == "expired" or (state.found == "failed" and state.landed):
            return "in_doubt"  # claimed and never finished: it may have landed before
        return state.found

    def _forward_action(self, compensation: str, forward_key: object) -> str | None:
        if not isinstance(forward_key, str):
            return None
        for name, spec in self.catalog.actions.items():
            if spec.compensation == compensation and forward_key.endswith(f":{name}"):
                return name
        return None


class Outcome:
    """A request's verdict, the attempt it came at, for a compensation what its forward key
    held, whether a call was made (a refused claim stores nothing), and whether its system
    stored it in the key's row already (``recorded``: an atomic service's done call)."""

    __slots__ = ("attempt", "called", "forward", "recorded", "verdict")

    def __init__(
        self, verdict: Verdict | Running, attempt: int, forward: SettleVerdict | None = None, *,
        called: bool = True, recorded: bool = False,
    ) -> None:  # fmt: skip
        self.verdict, self.attempt, self.forward, self.called = verdict, attempt, forward, called
        self.recorded = recorded


def _refusal(ticket: Ticket, atomic: bool) -> Verdict | Running:
    """What a claim that refused a call means, reported without calling."""
    if ticket.kind == "done":
        return Done(ticket.result or {})
    if ticket.kind == "failed":
        return Permanent(ticket.error or "failed", may_have_landed=ticket.landed)
    if ticket.kind == "fenced":
        return Permanent(f"fenced, nothing done: {ticket.error or 'settled first'}")
    if ticket.kind == "busy":
        return Running(ticket.owner, ticket.lease_s or 0.0)
    # spent: a crash or an earlier process used this send's attempts; an unfinished claim of
    # a system that is not atomic with its record may have landed.
    return Permanent(
        f"the attempts of this send are used up ({ticket.attempt}), crashes included",
        may_have_landed=ticket.landed or not atomic,
    )  # fmt: skip


def _finished(key: str, verdict: Verdict | Running) -> Finished:
    if isinstance(verdict, Running):  # a refused claim: nothing of this process's to store
        raise AssertionError(f"{key}: a claim held elsewhere is never finished here")
    if isinstance(verdict, Done):
        return Finished(key, "done", verdict.result)
    if isinstance(verdict, Transient) and verdict.may_have_landed:
        return Finished(key, "released", error=str(verdict), landed=True)
    return Finished(key, "failed", error=str(verdict), landed=verdict.may_have_landed)
