"""The design's rules, checked on a finished simulated run against what the systems hold (the
truth), not only against what the register says. Each broken rule is a ``Violation`` naming the
rule, the saga and what is wrong."""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING

from saga_coordinator.register import TERMINAL, SagaState, forward_key
from saga_shared.model.catalog import ActionClass
from saga_shared.model.messages import CommandReply

if TYPE_CHECKING:
    from saga_app.sim.world import World


@dataclass(frozen=True)
class Violation:
    rule: str
    saga_id: str
    text: str

    def __str__(self) -> str:
        return f"rule {self.rule}: {self.saga_id}: {self.text}"


def check(world: World) -> list[Violation]:
    out: list[Violation] = []
    applied = _applied(world)
    for plan in world.plan.sagas:
        state = world.saga(plan.saga_id)
        if state is None:
            out.append(Violation("1", plan.saga_id, "never started"))
            continue
        if state.status not in TERMINAL:
            out.append(Violation("1", plan.saga_id, f"did not end: {state.status}"))
        out += _truth(world, state, applied)
        out += _compensations(state)
    out += _effects_once(applied)
    out += _attempts(world)
    out += _orders(world)
    out += _answers(world)
    out += _dead_letters(world)
    return out


def _applied(world: World) -> dict[str, int]:
    """Effects applied per idempotency key, in every system."""
    count: dict[str, int] = defaultdict(int)
    for entry in world.systems.effects:
        count[entry["idempotency_key"]] += 1
    for key in world.gateway.sent:
        count[key] += 1
    return count


def _truth(world: World, state: SagaState, applied: dict[str, int]) -> list[Violation]:
    """Rule 2: no saga compensated with an irreversible effect that landed; the register's
    word on each step matches what the systems hold."""
    out = []
    for step in state.steps:
        landed = applied.get(forward_key(state.saga_id, step.action), 0) > 0
        irreversible = step.action_class is ActionClass.IRREVERSIBLE
        if irreversible and landed and state.status == "compensated":
            out.append(Violation("2", state.saga_id, f"compensated, but {step.action} happened"))
        if step.settled == "did_not_happen" and landed:
            out.append(Violation("2", state.saga_id, f"{step.action} settled as not happened "
                                 f"(by {step.settled_by}) but it happened"))  # fmt: skip
        if irreversible and step.status == "done" and not landed:
            out.append(Violation("2", state.saga_id, f"{step.action} done, but nothing landed"))
        if state.status == "completed" and step.status != "done":
            out.append(Violation("1", state.saga_id, f"completed with {step.action} "
                                 f"{step.status}"))  # fmt: skip
    return out


def _compensations(state: SagaState) -> list[Violation]:
    """Rule 4: compensated only what may have landed, in reverse order of landing."""
    out = []
    undone = [s for s in state.steps if s.compensation_status == "compensated"]
    for step in undone:
        if step.landed_seq is None:
            out.append(Violation("4", state.saga_id, f"{step.action} compensated, never landed"))
    by_time = sorted(undone, key=lambda s: (s.compensated_at or state.created_at, s.index))
    seqs = [s.landed_seq or 0 for s in by_time]
    if not state.compensation_priority and seqs != sorted(seqs, reverse=True):
        out.append(Violation("4", state.saga_id, f"undone out of order: landed {seqs}"))
    if state.status == "compensated":
        for step in state.steps:
            if step.may_have_landed and step.action_class.needs_compensation \
                    and step.compensation_status != "compensated":  # fmt: skip
                out.append(Violation("5", state.saga_id, f"compensated, but {step.action} is "
                                     f"{step.compensation_status}"))  # fmt: skip
    return out


def _effects_once(applied: dict[str, int]) -> list[Violation]:
    """Rule 3: each side effect at most once per idempotency key."""
    return [Violation("3", key.split(":")[0], f"{key} applied {n} times")
            for key, n in applied.items() if n > 1]  # fmt: skip


def _attempts(world: World) -> list[Violation]:
    """The catalog's attempts bound the calls of one send, crashes and re-runs included."""
    out = []
    for (key, send), calls in world.records.calls.items():
        action = key.split(":", 1)[1].split(":")[0]
        limit = world.catalog.retry_policy(action).attempts
        if calls > limit:
            out.append(Violation("attempts", key.split(":")[0],
                                 f"{key} send {send} called {calls} times, the catalog allows "
                                 f"{limit}"))  # fmt: skip
    return out


def _orders(world: World) -> list[Violation]:
    """Rule 6: one active saga per order at a time, in the order their starts were sent."""
    out = []
    by_order: dict[str, list[int]] = defaultdict(list)
    for plan in world.plan.sagas:
        by_order[plan.order_id].append(plan.number)
    # A start the broker lost after confirming it (a single node killed within its loss
    # window: docs/explanation/not-yet.md) arrives again only when its agent resends it,
    # behind a start sent after it: no product can keep the order of what the broker
    # confirmed and dropped.
    lost_ids = {e.message_id for e in world.broker.trace
                if e.kind == "lost" and e.detail == "committed in the crash window"}  # fmt: skip
    lost = {f"s-{p.number}" for p in world.plan.sagas if f"m{p.number}-start" in lost_ids}
    for order, numbers in by_order.items():
        states = [world.saga(f"s-{n}") for n in sorted(numbers)]
        ran = [s for s in states if s is not None and s.steps[0].started_at is not None]
        for first, second in itertools.pairwise(ran):
            began = second.steps[0].started_at
            if first.saga_id in lost:
                continue  # the broker, not the product, changed their order (see ``lost``)
            if first.finished_at is None or began is None or began < first.finished_at:
                why = f"ran before {first.saga_id} of order {order} ended (sent in that order)"
                out.append(Violation("6", second.saga_id, why))
    memory = world.store.memory.state
    for order in memory.blocks:
        if memory.blocks[order]:
            out.append(Violation("7", order, f"order still blocked: {list(memory.blocks[order])}"))
    return out


def _answers(world: World) -> list[Violation]:
    """Rule 12: every command sent got an answer; a repeat is answered as the first was; a
    conflicting one is refused."""
    out = []
    answers = world.records.answers
    kept = {
        reply.command_id: reply
        for body in world.store.memory.state.replies.values()
        if (reply := CommandReply.model_validate_json(body)).type != "command.parked"
    }
    for message_id, (user, command) in world.records.commands.items():
        got = answers.get(message_id, [])
        if not got:
            out.append(Violation("12", command.saga_id, f"{command.type} {message_id} from "
                                 f"{user} was never answered"))  # fmt: skip
            continue
        # A command parked behind a blocked order is answered so at once, and again once
        # applied: the last answer is what it came to. That one may have gone to a reply
        # queue that died with its connection (a broker crash meanwhile): then the reply the
        # coordinator kept for the command is what it came to.
        last = got[-1]
        if last.type == "command.parked":
            last = kept.get(message_id, last)
        if message_id.endswith("-again") and not last.reason.startswith("already started"):
            # As for a conflict (below): when the broker lost the start, the repeat comes
            # first and starts the saga, and the start, sent again, is the repeat.
            first = answers.get(message_id.replace("-again", "-start"), [])
            if not (first and first[-1].reason.startswith("already started")):
                out.append(Violation("12", command.saga_id, f"a repeated start was answered "
                                     f"{last.type}: {last.reason}"))  # fmt: skip
        elif message_id.endswith("-conflict") and last.type != "command.rejected":
            # Sent right behind its start: when the broker lost the start (a crash), the
            # conflict arrives first and is the start, and the start is the one refused.
            first = answers.get(message_id.replace("-conflict", "-start"), [])
            if not (first and first[-1].type == "command.rejected" and "other" in first[-1].reason):
                out.append(Violation("12", command.saga_id, f"a conflicting start was answered "
                                     f"{last.type}: {last.reason}"))  # fmt: skip
    return out


def _dead_letters(world: World) -> list[Violation]:
    """Rules 7, 10, 11: what holds an order was replayed; forgeries were dead-lettered as
    such, never applied."""
    out = []
    for state in world.store.memory.sagas():
        for step in state.steps:
            if "forged" in str(step.result or {}):
                out.append(Violation("11", state.saga_id, f"a forged outcome was applied to "
                                     f"{step.action}"))  # fmt: skip
    # The broker may lose the forgery in a crash, as it may lose anyone's message.
    lost = {e.message_id for e in world.broker.trace if e.kind == "lost"}
    forged = world.records.forged
    if world.plan.forgeries and forged is not None and forged not in lost:
        reasons = {letter.reason for letter in world.records.letters}
        if "forged" not in reasons:
            out.append(Violation("11", "-", "the forged outcome was not dead-lettered as forged"))
    return out
