"""A request lost with its queue, pure: sent again at once, not counted against the step's sends.

A request travels through its service's classic request queue (``Topology.request_queue``), which
goes away with its node or a broker restart, with whatever waited in it. The coordinator finds
the queue gone (a publish comes back unroutable, or its watch does not find it:
``saga_coordinator.queue_watch``), declares it again, and hands each step whose request is out
to that service a ``saga.deadline`` marked ``lost``, through the order's partition like any
deadline. Here it becomes one more send of the same request (same key: at most one effect),
under a send number of its own, and the step's budget of sends grows by one: losing a queue
costs a resend, never a saga. A send that was not lost after all (its adapter had it in hand)
is absorbed by the service's key record; a lost-marked message for a send that was answered or
sent again meanwhile is stale, and ignored. A coordinator that takes a partition over hands the
same message to every step of it with a request out (``QueueWatch.resume``): a queue may have
been lost while nobody owned the partition.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime

from saga_coordinator.register import SagaState, Step
from saga_coordinator.transition import Outgoing, Transition, event, ignored, request
from saga_shared.model.catalog import service_of
from saga_shared.model.messages import DeadlineReached


def out_to(service: str, idempotency_key: str) -> bool:
    """Whether a request key may be one of ``service``'s (``saga:service.action[:...]``): the
    stores' first cut; ``resend_lost`` checks the step itself."""
    return f":{service}." in idempotency_key


def marked(
    saga_id: str, order_id: str, step: int, phase: str, key: str, attempt: int,
    services: Collection[str],
) -> list[DeadlineReached]:  # fmt: skip
    """An armed request deadline, as lost-marked messages: one per service it may be out to."""
    return [
        DeadlineReached.model_validate(
            {
                "saga_id": saga_id,
                "order_id": order_id,
                "step": step,
                "phase": phase,
                "idempotency_key": key,
                "attempt": attempt,
                "lost": service,
            }
        )
        for service in sorted(services)
        if phase in ("forward", "compensation") and out_to(service, key)
    ]


def resend_lost(
    state: SagaState, step: Step, forward: bool, service: str, now: datetime
) -> Transition:
    """``step``'s current send (checked not stale by the caller) went to ``service``'s lost
    queue: send it again, uncounted."""
    action = step.action if forward else step.compensation
    if action is None or service_of(action) != service:
        return ignored(state, f"step {step.index} has no request out to {service}")
    if forward:
        step = step.evolve(sends=step.sends + 1, max_sends=step.max_sends + 1)
    else:
        step = step.evolve(compensation_sends=step.compensation_sends + 1,
                           compensation_max_sends=step.compensation_max_sends + 1)  # fmt: skip
    state = state.with_step(step, updated_at=now)
    detail = (
        f"the request may have been lost with the request queue of {service} (found gone, "
        "or the partition taken over): sent again, not counted against the sends"
    )
    out: list[Outgoing] = [
        request(state, step, "forward" if forward else "compensation", now),
        event(state, "step.resent", now, step, detail=detail),
    ]
    return Transition(state, tuple(out), note=f"step {step.index} sent again: {service} lost")
