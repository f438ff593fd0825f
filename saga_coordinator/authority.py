"""Who may do what to a saga. Pure.

The intake refuses what a role may never send (``may_send``); the coordinator, which knows the
saga, refuses what this sender may not do to this saga (``may_act``). Agents start sagas and may
abort or ask about their own; operators also resume, and decide at gates that do not require a
person; only people resolve, and decide at gates that do.
"""

from __future__ import annotations

from saga_coordinator.register import SagaState
from shared.messages import Role, Sender

# What each role may ever send. "console" acts for the people signed in to it.
_SENDS: dict[Role, frozenset[str]] = {
    "agent": frozenset({"saga.start", "saga.status", "saga.abort"}),
    "ops": frozenset({"saga.start", "saga.status", "saga.abort", "saga.resume", "saga.approve",
                      "saga.reject", "dlq.replay", "dlq.discard"}),
    "person": frozenset({"saga.start", "saga.status", "saga.abort", "saga.resume",
                         "saga.approve", "saga.reject", "saga.resolve", "saga.settle",
                         "dlq.replay", "dlq.discard"}),
}  # fmt: skip
_SENDS["console"] = _SENDS["ops"]


def may_send(role: Role, command_type: str) -> str | None:
    """None when ``role`` may send ``command_type``; otherwise why not."""
    if command_type in _SENDS.get(role, frozenset()):
        return None
    if command_type == "saga.resolve":
        return "only a person may resolve a saga"
    if command_type == "saga.settle":
        return "only a person may settle a step in doubt, from that person's own account"
    return f"{role} accounts may not send {command_type}"


def may_act(state: SagaState, command_type: str, sender: Sender | None) -> str | None:
    """None when ``sender`` may send ``command_type`` about ``state``; otherwise why not."""
    if sender is None:
        return "the command has no verified sender"
    refused = may_send(sender.role, command_type)
    if refused is not None:
        return refused
    owner = state.started_by
    if sender.role == "agent" and (owner is None or owner.user != sender.user):
        return f"saga {state.saga_id} was not started by {sender.user}"
    return None


def may_decide_gate(require_person: bool, sender: Sender | None) -> str | None:
    if sender is None or sender.role == "agent":
        return "an agent cannot decide at an approval gate"
    if require_person and sender.role != "person":
        return "this gate needs a person's decision, sent from that person's own account"
    return None
