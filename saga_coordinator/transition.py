"""What a decision returns: the new register and the messages to send, with their builders."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from saga_coordinator.register import Decision, SagaState, Step, compensation_key, forward_key
from saga_shared.model.messages import (
    ActionRequest,
    AnyCommand,
    CommandReply,
    EventType,
    Phase,
    SagaEvent,
    SettleRequest,
)


@dataclass(frozen=True)
class Reply:
    to: str
    message: CommandReply
    # The message id of the command it answers, as the inbox has it: the answer is kept under
    # it, for when the command is sent again (``Processor``).
    remember_as: str | None = None


@dataclass(frozen=True)
class Event:
    """A lifecycle event as a decision makes it. Its message (``SagaEvent``, with an id and
    validated) is built only when it is published: most step events are not (``SAGA_EVENTS``),
    and building them cost a sixth of a decision."""

    type: EventType
    state: SagaState
    now: datetime
    step: Step | None = None
    detail: str = ""
    register: bool = False  # the whole register goes with it (terminal events, alerts)
    stakes: dict[str, Any] | None = field(default=None, compare=False)

    @property
    def saga(self) -> str:
        return self.state.saga

    @property
    def status(self) -> str:
        return self.state.status

    def message(self) -> SagaEvent:
        state, step = self.state, self.step
        return SagaEvent(
            type=self.type,
            saga_id=state.saga_id,
            order_id=state.order_id,
            timestamp=self.now,
            saga=state.saga,
            status=state.status,
            step=None if step is None else step.index,
            action=None if step is None else step.action,
            detail=self.detail,
            saga_register=state.register() if self.register else None,
            stakes=self.stakes,
        )


Outgoing = ActionRequest | SettleRequest | Event | Reply


@dataclass(frozen=True)
class Transition:
    state: SagaState | None  # the register to store; None when nothing is stored
    out: tuple[Outgoing, ...] = ()
    note: str = ""  # what happened, for the saga log (why a message was ignored, say)
    changed: bool = True
    # A refused command: why, and the rule it broke (recorded with the gateway's rejections).
    refused: str | None = None
    rule: str = "saga_state"


def request(state: SagaState, step: Step, phase: Phase, now: datetime) -> ActionRequest:
    if phase == "forward":
        action, key, timeout = step.action, forward_key(state.saga_id, step.action), step.timeout_s
        params: dict[str, Any] = dict(step.params)
    else:
        assert step.compensation is not None
        action, key = step.compensation, compensation_key(state.saga_id, step)
        timeout = step.compensation_timeout_s
        # The identifiers come from the adapter's result, never reconstructed; when the effect
        # is unknown there is no result, and the forward key lets the system find what landed.
        known = step.result or {}
        params = {f: known[f] for f in step.result_fields if known.get(f) not in (None, "")}
        params["forward_key"] = forward_key(state.saga_id, step.action)
    return ActionRequest(
        saga_id=state.saga_id,
        order_id=state.order_id,
        timestamp=now,
        action=action,
        phase="forward" if phase == "forward" else "compensation",
        step=step.index,
        idempotency_key=key,
        params=params,
        timeout_s=timeout,
        attempt=step.sends if phase == "forward" else step.compensation_sends,
    )


def settle_request(state: SagaState, step: Step, now: datetime) -> SettleRequest:
    return SettleRequest(
        saga_id=state.saga_id, order_id=state.order_id, timestamp=now, action=step.action,
        step=step.index, idempotency_key=forward_key(state.saga_id, step.action),
        attempt=step.settle_sends, fence_expired=step.settle_fence,
        fence_claims=step.fence_claims,
    )  # fmt: skip


def event(
    state: SagaState,
    kind: EventType,
    now: datetime,
    step: Step | None = None,
    *,
    detail: str = "",
    register: bool = False,
    stakes: dict[str, Any] | None = None,
) -> Event:
    return Event(kind, state, now, step, detail, register, stakes)


def reply(
    command: AnyCommand, now: datetime, refusal: str | None = None, *, note: str = ""
) -> tuple[Reply, ...]:
    """The answer to ``command``: accepted (``note`` says more, such as "already started"),
    or refused with the reason."""
    if command.reply_to is None:
        return ()
    message = CommandReply(
        type="command.accepted" if refusal is None else "command.rejected",
        saga_id=command.saga_id,
        order_id=command.order_id,
        timestamp=now,
        command_id=command.client_message_id or command.message_id,
        command_type=command.type,
        reason=refusal or note,
    )
    return (Reply(command.reply_to, message, command.message_id),)


def refuse(
    state: SagaState | None,
    command: AnyCommand,
    now: datetime,
    reason: str,
    rule: str = "saga_state",
) -> Transition:
    """A command refused: the register is unchanged, the sender is told why (when it gave a
    reply_to), and the refusal is recorded either way."""
    return Transition(
        state, reply(command, now, reason), note=reason, changed=False, refused=reason, rule=rule
    )


def ignored(state: SagaState, note: str) -> Transition:
    return Transition(state, (), note=note, changed=False)


def decided(
    kind: str, note: str, command: AnyCommand, now: datetime, step: int | None = None
) -> Decision:
    """A decision as the register keeps it: by the broker-verified sender of the command."""
    sender = command.sender
    return Decision(
        kind=kind,
        note=note,
        at=now,
        by=sender.user if sender else "",
        role=sender.acting_as if sender else "",
        step=step,
    )
