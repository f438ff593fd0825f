"""Handles one partition message inside one transaction: dedupe, convoy, decision, drain.

The order row is locked first, so every message of one order is handled one at a time even if
two coordinators receive messages of the same order. Then the convoy rules decide (park, stale or
apply), the pure state machine decides what the saga does, and when the message unblocks its
order, the messages parked behind it are applied in order in the same transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from datetime import datetime

from opentelemetry.context import Context
from pydantic import TypeAdapter

from saga_coordinator import convoy, deadline, repeats
from saga_coordinator.convoy import OrderView, Verdict
from saga_coordinator.machine import begin, decide
from saga_coordinator.ports import Transaction as Tx
from saga_coordinator.register import SagaState
from saga_coordinator.rows import Claim, OutboxRow
from saga_coordinator.transition import Event, Reply, Transition
from saga_shared.model.catalog import Catalog, service_of
from saga_shared.model.gateway import AdmittedPlan
from saga_shared.model.messages import ActionRequest, CommandReply, PartitionMessage, SettleRequest
from saga_shared.observability import tracing
from saga_shared.transport.codec import PARTITION
from saga_shared.transport.topology import Topology

_PARTITION: TypeAdapter[PartitionMessage] = PARTITION


def route(topology: Topology, transition: Transition) -> list[OutboxRow]:
    """Requests to their service's request queue, settles to its quorum queue, replies to the
    agent's reply queue, lifecycle events to the public topic exchange under their type (those
    ``SAGA_EVENTS`` chose)."""
    rows = []
    for item in transition.out:
        if isinstance(item, Reply):
            rows.append(OutboxRow.of("", item.to, item.message))
        elif isinstance(item, ActionRequest):
            key = topology.request_key(service_of(item.action))
            row = OutboxRow.of(topology.actions_exchange, key, item)
            rows.append(replace(row, local=item.attempt == 1))
        elif isinstance(item, SettleRequest):
            service = service_of(item.action)
            rows.append(OutboxRow.of(topology.actions_exchange, service, item))
        elif topology.publishes(item.type):
            rows.append(OutboxRow.of(topology.events_exchange, item.type, item.message()))
    carried = tracing.headers_of()  # the current span's context goes with every message
    return [replace(row, headers={**row.headers, **carried}) for row in rows] if carried else rows


def parked_reply(message: PartitionMessage, reason: str, now: datetime) -> Transition:
    """Tell a waiting agent its command is kept, not lost: it runs once the order is free."""
    reply_to = getattr(message, "reply_to", None)
    if reply_to is None:
        return Transition(None)
    reply = CommandReply(
        type="command.parked",
        saga_id=message.saga_id,
        order_id=message.order_id,
        timestamp=now,
        command_id=getattr(message, "client_message_id", None) or message.message_id,
        command_type=message.type,
        reason=reason,
    )
    return Transition(None, (Reply(reply_to, reply, message.message_id),))


class Processor:
    def __init__(self, catalog: Catalog, topology: Topology) -> None:
        self.catalog = catalog
        self.topology = topology
        # The trace context each message in hand arrived with, by message id (the consumer
        # puts it here; the message models carry no transport headers).
        self.parents: dict[str, Context] = {}
        # The plans the gateway admitted for the starts in hand, by the id() of the message
        # object itself, alive while its entry is (see Coordinator._submit).
        self.plans: dict[int, AdmittedPlan] = {}

    async def handle(self, tx: Tx, message: PartitionMessage, now: datetime) -> str:
        """Returns what happened, for the log line."""
        [note] = await self.handle_batch(tx, [message], now)
        return note

    async def handle_batch(
        self, tx: Tx, messages: Sequence[PartitionMessage], now: datetime
    ) -> list[str]:
        """Several messages in one transaction, each as if alone: no two share an order, and
        each order's row stays locked until the commit."""
        claims = await tx.claim(messages)
        return [await self._handle(tx, m, c, now) for m, c in zip(messages, claims, strict=True)]

    async def _handle(self, tx: Tx, message: PartitionMessage, claim: Claim, now: datetime) -> str:
        if not claim.fresh:
            await self._release(tx, claim.order, message.message_id, now)
            note = "duplicate absorbed"
            if getattr(message, "reply_to", None) is not None:
                stored = await tx.stored_reply(message.message_id)
                again = repeats.answer_again(message, stored, claim.saga, now)
                self._store(tx, again, now, message)
                note += ", answered again" if again.out else ", answered once settled"
            tx.log(message, message.saga_id, note, None)
            return note
        order = claim.order
        seq = convoy.command_seq(message)
        arrival = None
        if convoy.blocked_by(order, message.message_id):
            # The message its order waited for has arrived: the block goes whatever happens
            # next. Were it kept while the message itself waits for a missing command number,
            # the two would wait for each other for ever.
            arrival = await tx.unblock(order.order_id, message.message_id)
            order = convoy.without_block(order, message.message_id)
        admission = convoy.admit(order, message.message_id, seq)
        if admission.verdict is Verdict.APPLY and arrival is not None and order.has_parked:
            # Messages are parked behind this one, some perhaps from before it (the dead
            # letters of an order are replayed one by one): it takes its place among them, by
            # the arrival number its block kept, and the drain applies them all in that order.
            admission = convoy.Admission(Verdict.PARK, "back in its place among the parked")
        if admission.verdict is Verdict.APPLY:
            order, note = await self._apply(tx, order, message, now, claim)
        elif admission.verdict is Verdict.PARK:
            await tx.park(message, seq, admission.reason, arrival)
            order = replace(order, has_parked=True)
            parked = parked_reply(message, admission.reason, now)
            self._store(tx, parked, now)
            note = f"parked: {admission.reason}"
            tx.log(message, message.saga_id, note, None)
        else:
            note = f"stale: {admission.reason}"
            tx.log(message, message.saga_id, note, None)
        order = await self.drain(tx, order, now)
        tx.save_order(order)
        return note

    async def release(self, tx: Tx, order_id: str, message_id: str, now: datetime) -> OrderView:
        """Lift one block of an order (its message was handled, replayed elsewhere or discarded)
        and, when nothing else blocks it, apply what was parked behind."""
        return await self._release(tx, await tx.lock_order(order_id), message_id, now)

    async def _release(self, tx: Tx, order: OrderView, message_id: str, now: datetime) -> OrderView:
        if not convoy.blocked_by(order, message_id):
            return order
        await tx.unblock(order.order_id, message_id)
        order = await self.drain(tx, convoy.without_block(order, message_id), now)
        tx.save_order(order)
        return order

    async def discard(
        self,
        tx: Tx,
        order_id: str,
        message_id: str,
        replacement: PartitionMessage | None,
        now: datetime,
    ) -> OrderView:
        """Lift the block of a discarded message; what it leaves behind (``replacement``, for
        a request: its step's failure) takes its place among the parked, in arrival order."""
        order = await tx.lock_order(order_id)
        arrival = await tx.unblock(order_id, message_id) if convoy.blocked_by(order, message_id) \
            else None  # fmt: skip
        order = convoy.without_block(order, message_id)
        if replacement is not None:
            await tx.park(replacement, None, "in place of a discarded message", arrival)
            order = replace(order, has_parked=True)
        order = await self.drain(tx, order, now)
        tx.save_order(order)
        return order

    async def drain(self, tx: Tx, order: OrderView, now: datetime) -> OrderView:
        """Apply the messages parked behind a block, in arrival order, while nothing blocks. A
        command still waiting for a missing number stays parked; passes repeat until none moves."""
        if order.blocks or not order.has_parked:
            return order  # still blocked, or nothing parked: no query on the hot path
        moved = True
        while moved:
            moved = False
            for parked in await tx.parked(order.order_id):
                admission = convoy.admit(order, parked.message_id, parked.seq)
                if admission.verdict is Verdict.PARK:
                    continue
                await tx.unpark(parked.id)
                moved = True
                if parked.message_type == convoy.SKIP:
                    if admission.verdict is Verdict.APPLY:
                        order = convoy.skip_seq(order)
                    continue
                message = _PARTITION.validate_json(parked.body)
                if admission.verdict is Verdict.STALE:
                    tx.log(message, message.saga_id, f"stale: {admission.reason}", None)
                    continue
                order, _ = await self._apply(tx, order, message, now)
        return order

    async def _apply(
        self,
        tx: Tx,
        order: OrderView,
        message: PartitionMessage,
        now: datetime,
        claim: Claim | None = None,
    ) -> tuple[OrderView, str]:
        """``claim``: what ``Tx.claim`` read for this message, the saga included (or its
        absence: no saga row appears while the order is locked); a parked message has none."""
        before = claim.saga if claim is not None else await tx.lock_saga(message.saga_id)
        transition = decide(
            before, message, self.catalog, now,
            order_held_by=convoy.held_by(order, message.saga_id),
            admitted=self.plans.get(id(message)),
        )  # fmt: skip
        order = convoy.after_apply(order, convoy.command_seq(message))
        status = transition.state.status if transition.state is not None else None
        order = convoy.after_decision(order, status)
        self._store(tx, transition, now, message)
        tx.log(message, message.saga_id, transition.note, order.handled)
        return await self._hand_over(tx, order, transition, now), transition.note

    def _store(
        self, tx: Tx, transition: Transition, now: datetime, message: PartitionMessage | None = None
    ) -> None:
        # Ended once the transaction commits: a group decided on the cache and then again
        # under locks (or split, or retried) traces each decision once.
        with self._span(transition.state, message) as span:
            tx.on_commit(span.end)
            state = transition.state
            if state is not None and transition.changed:
                # Each stored change is a new version of the register, which a person's
                # decision names; the first is the saga's root span too.
                trace = state.trace or tracing.traceparent(span)
                state = state.evolve(version=state.version + 1, trace=trace)
                transition = replace(transition, state=state)
                tx.save_saga(state, now=now)
                self._deadline(tx, state, transition, now)
            tx.outbox(route(self.topology, transition))
            tx.count([item for item in transition.out if isinstance(item, Event)])
            for item in transition.out:
                if isinstance(item, Reply) and item.remember_as is not None:
                    tx.remember_reply(item.remember_as, item.message)
        if message is not None and transition.refused is not None:
            sender = getattr(message, "sender", None)
            user = sender.user if sender is not None else None
            tx.refusal(message, transition.rule, transition.refused, user)

    def _span(
        self, state: SagaState | None, message: PartitionMessage | None
    ) -> AbstractContextManager[tracing.Span]:
        """The span of one decision: a child of the context its message came with when that
        is the saga's own trace, else of the saga's root (a deadline, a saga that waited)."""
        incoming = self.parents.get(message.message_id) if message is not None else None
        root = tracing.extract({"traceparent": state.trace}) if state and state.trace else None
        own = root is None or (incoming is not None and tracing.same_trace(incoming, root))
        parent = incoming if own else root
        name = f"coordinator {message.type}" if message is not None else "coordinator hand-over"
        return tracing.current(
            name, context=parent, kind=tracing.SpanKind.CONSUMER, end_on_exit=False,
            attributes=lambda: tracing.attributes(state.saga_id, state.order_id) if state else {},
        )  # fmt: skip

    def _deadline(self, tx: Tx, state: SagaState, transition: Transition, now: datetime) -> None:
        change = deadline.after(state, transition, now)
        if isinstance(change, deadline.Arm):
            tx.arm_deadline(
                state, change.step, change.phase, change.idempotency_key, change.attempt,
                change.due_at,
            )  # fmt: skip
        elif isinstance(change, deadline.Disarm):
            tx.disarm_deadline(state.saga_id)

    async def _hand_over(
        self, tx: Tx, order: OrderView, transition: Transition, now: datetime
    ) -> OrderView:
        """Keep one saga per order active: a saga that starts takes the order; one that ends
        passes it to the oldest waiting saga. ``needs_human`` keeps it."""
        state = transition.state
        if state is None:
            return order
        decision = convoy.hand_over(order, state.saga_id, state.status)
        if decision == "take":
            return convoy.with_active(order, state.saga_id)
        if decision == "keep":
            return order
        # Most orders have no saga queued: skip the query (and the flush it would force).
        waiting = await tx.next_waiting(order.order_id) if order.has_waiting else None
        if waiting is None:
            return convoy.with_active(order, None)
        started = begin(waiting, now)
        self._store(tx, started, now)
        # The sagas still waiting now wait for this one: their registers say so.
        await tx.waiting_for(order.order_id, waiting.saga_id)
        return convoy.with_active(order, waiting.saga_id)
