"""What happens in a simulated run, as tasks on the virtual loop: each saga's agent, the
world's faults, a rogue agent's forgeries, the people who decide at gates and settle steps in
doubt (they look at the systems, as a person reads the mail server's log), and the operator who
resumes and replays dead letters once the faults are healed."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import aio_pika
from pydantic import JsonValue

from saga_app.sim.adapters import AdapterProcess
from saga_app.sim.plan import Fault, SagaPlan
from saga_coordinator.register import TERMINAL, SagaState, Step, forward_key
from saga_shared.model.messages import (
    AbortSaga,
    ActionDone,
    ApproveSaga,
    RejectSaga,
    ResumeSaga,
    SettleSaga,
    StartSaga,
)
from saga_shared.transport.codec import message_to_amqp

if TYPE_CHECKING:
    from saga_app.sim.coordinator import CoordinatorProcess
    from saga_app.sim.world import World

PEOPLE_POLL_S = 3.0


async def _at(t: float) -> None:
    await asyncio.sleep(max(0.0, t - asyncio.get_running_loop().time()))


def params_for(world: World, plan: SagaPlan) -> dict[str, JsonValue]:
    names = {p for a in world.catalog.sagas[plan.saga].steps
             for p in world.catalog.actions[a].params}  # fmt: skip
    return {k: v for k, v in plan.params.items() if k in names}


async def saga(world: World, plan: SagaPlan) -> None:
    """An agent starts the saga (maybe several times under one id, again under another, once
    more with other parameters), then maybe aborts it."""
    await _at(plan.at)
    for action, mode in plan.faults:
        world.systems.add_fault(action, plan.order_id, mode)
    if plan.text_delay_s:
        world.gateway.delay_s[plan.order_id] = plan.text_delay_s
    agent = world.sender(f"saga-agent-{plan.agent}")
    n = plan.number
    start = StartSaga(message_id=f"m{n}-start", saga_id=plan.saga_id, order_id=plan.order_id,
                      saga=plan.saga, params=params_for(world, plan))  # fmt: skip
    sends = [agent.send(start, copies=plan.copies)]
    if plan.again:
        sends.append(agent.send(start.model_copy(update={"message_id": f"m{n}-again"})))
    if plan.conflict:
        other = {**start.params, "amount_cents": 1 + int(str(start.params["amount_cents"]))}
        sends.append(agent.send(start.model_copy(update={"message_id": f"m{n}-conflict",
                                                         "params": other})))  # fmt: skip
    await asyncio.gather(*sends)
    if plan.abort_after_s is not None:
        await asyncio.sleep(plan.abort_after_s)
        abort = AbortSaga(
            message_id=f"m{n}-abort",
            saga_id=plan.saga_id,
            order_id=plan.order_id,
            reason="the customer changed their mind",
        )
        await asyncio.gather(
            agent.send(abort, copies=2),
            agent.send(abort.model_copy(update={"message_id": f"m{n}-abort2"})),
        )


async def fault(world: World, f: Fault) -> None:
    await _at(f.at)
    if world.quiet:
        return
    if f.kind == "database":
        world.store.down_until = asyncio.get_running_loop().time() + f.for_s
        world.note("database", f"away for {f.for_s:.1f}s")
        return
    if f.kind == "queues":
        lose_requests(world, deleted=f.target == "deleted")
        return
    if f.kind == "broker":
        world.note("broker", f"crashed, down for {f.for_s:.1f}s")
        world.broker.crash()
        await asyncio.sleep(f.for_s)
        if world.broker.up:
            return
        world.broker.restart()
        world.note("broker", "restarted")
        for process in world.processes.values():  # each reconnects and subscribes again
            if process.alive:
                process.stop("broker connection lost")
                await start(process)
        return
    process = world.processes[f.target]
    if f.kind == "point":
        world.armed[f.target] = (f.point, f.for_s)
        return
    if f.kind == "freeze" and isinstance(process, AdapterProcess):
        process.freeze()
        await asyncio.sleep(f.for_s)
        process.thaw()
        return
    process.stop("killed")
    await restart(world, process, f.for_s)


def lose_requests(world: World, *, deleted: bool) -> None:
    """Every request and outcome queue lost at this instant (what is in it and in its consumers'
    hands): deleted with its node (consumers cancelled; declared again by the next publish that
    comes back, or the coordinators' watch), or emptied while it survives."""
    broker, t = world.broker, world.topology
    if not broker.up:
        return
    for name in [n for n in list(broker.queues) if t.is_transient_queue(n)]:
        if deleted:
            broker.delete_queue(name)
        else:
            queue = broker.queues[name]
            for stored in queue.keep_only(lambda _: False):
                broker.record("lost", name, stored, "lost from a queue that survives")
    world.note("broker", f"request and outcome queues {'deleted' if deleted else 'emptied'}")


async def restart(
    world: World, process: CoordinatorProcess | AdapterProcess, after_s: float
) -> None:
    await asyncio.sleep(after_s)
    if not process.alive and world.broker.up:
        await start(process)


async def start(process: CoordinatorProcess | AdapterProcess) -> None:
    if isinstance(process, AdapterProcess):
        await process.start()
    else:
        process.start()


FORGERY_TRIES = 120


async def forgeries(world: World, count: int) -> None:
    """A rogue agent: an outcome for a saga it does not own (forged: dead-lettered, never
    applied), a command that is not JSON (refused), a command under another's user_id (the
    broker refuses it at the door)."""
    if count == 0 or not world.plan.sagas:
        return
    rogue = world.sender("saga-agent-rogue")
    await _at(world.plan.sagas[0].at + 1.0)
    victim = world.plan.sagas[0]
    forged = ActionDone(saga_id=victim.saga_id, order_id=victim.order_id,
                        action="inventory.reserve_stock", phase="forward", step=0,
                        idempotency_key=forward_key(victim.saga_id, "inventory.reserve_stock"),
                        result={"reservation_id": "forged-by-a-rogue"})  # fmt: skip
    t = world.topology
    for _ in range(FORGERY_TRIES):  # a rogue tries again while the broker is down
        if rogue.raw(t.partitions_exchange, t.partition_key(victim.order_id),
                     message_to_amqp(forged)):  # fmt: skip
            world.records.forged = forged.message_id
            break
        await asyncio.sleep(1.0)
    junk = aio_pika.Message(b"{not json", message_id="m-rogue-junk", type="saga.start")
    rogue.raw(t.commands_exchange, t.command_key("saga.start", victim.order_id), junk)
    impostor = aio_pika.Message(b"{}", user_id="saga-coordinator", message_id="m-rogue-as")
    rogue.raw(t.commands_exchange, "saga.start", impostor)


async def people(world: World) -> None:
    """Ana decides at gates as each saga's plan says, settles a step in doubt once what the
    system holds says which way it went, and (once the world is quiet) the operator resumes
    what stopped on a failed compensation and replays the dead letters."""
    done: set[tuple[str, int]] = set()
    while True:
        await asyncio.sleep(PEOPLE_POLL_S)
        for row_id, row in list(world.store.memory.state.sagas.items()):
            if row.status not in ("awaiting_approval", "needs_human"):
                continue
            state = world.saga(row_id)
            if state is not None and (state.saga_id, state.version) not in done \
                    and _decide(world, state):  # fmt: skip
                done.add((state.saga_id, state.version))
        if world.quiet:
            _replay(world)


def _decide(world: World, state: SagaState) -> bool:
    """Send the decision ``state`` waits for, if its time has come; whether one was sent."""
    plan = world.sagas.get(state.saga_id)
    ids = {"saga_id": state.saga_id, "order_id": state.order_id}
    ana = world.sender("ana")
    if state.status == "awaiting_approval" and plan is not None:
        step = next(s.index for s in state.steps if s.gate_status == "waiting")
        tag = f"{state.saga_id}-{state.version}"
        if plan.gate == "agent_first":
            agent = world.sender(f"saga-agent-{plan.agent}")
            world.background(agent.send(ApproveSaga(message_id=f"{tag}-agent-approve",
                                                    step=step, **ids)))  # fmt: skip
        if plan.gate == "reject":
            command: Any = RejectSaga(message_id=f"{tag}-reject", step=step,
                                      reason="the address looks wrong", **ids)  # fmt: skip
        else:
            command = ApproveSaga(message_id=f"{tag}-approve", step=step, note="ok", **ids)
        world.background(ana.send(command))
        return True
    doubtful = next((s for s in state.steps if s.status == "in_doubt" and not s.settling), None)
    if doubtful is not None:
        happened = truth(world, state, doubtful)
        if happened is None:
            return False  # the system is still at it: look again later
        world.background(ana.send(SettleSaga(
            message_id=f"{state.saga_id}-{state.version}-settle", step=doubtful.index,
            happened=happened, note="checked the system's own log", version=state.version,
            **ids)))  # fmt: skip
        return True
    if state.status == "needs_human" and world.quiet:
        ops = world.sender("saga-ops")
        world.background(
            ops.send(
                ResumeSaga(
                    message_id=f"{state.saga_id}-{state.version}-resume",
                    note="faults cleared",
                    **ids,
                )
            )
        )
        return True
    return False


def truth(world: World, state: SagaState, step: Step) -> bool | None:
    """Whether ``step`` happened, as its system holds it (None: a call still on its way)."""
    key = forward_key(state.saga_id, step.action)
    if step.action.startswith("sms."):
        if key in world.gateway.landing:
            return None
        return key in world.gateway.sent
    applied = world.systems.effects_for_order(state.order_id)["applied"]
    return any(e["idempotency_key"] == key for e in applied)


def _replay(world: World) -> None:
    """The operator replays every dead letter that holds an order, as its first sender."""
    for letter in world.records.letters:
        if letter.replayed or not letter.blocks or letter.user is None:
            continue
        letter.replayed = True
        sender = world.sender(letter.user)
        headers = {k: v for k, v in letter.headers.items() if not k.startswith("x-")}
        headers["x-order-id"] = letter.headers.get("x-order-id")
        message = aio_pika.Message(letter.body, headers=headers, message_id=letter.message_id,
                                   type=letter.message_type, user_id=letter.user)  # fmt: skip
        sender.raw(letter.exchange, letter.routing_key, message)
        world.note("operator", f"replayed {letter.message_type} {letter.message_id}")


async def until_all_end(world: World, most_s: float) -> None:
    """Wait, quiet, until every planned saga has ended (or ``most_s`` passed)."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + most_s
    rows = world.store.memory.state.sagas
    while loop.time() < give_up:
        await asyncio.sleep(5.0)
        if all(s.saga_id in rows and rows[s.saga_id].status in TERMINAL for s in world.plan.sagas):
            await asyncio.sleep(30.0)  # late messages, resends and answers arrive
            return
