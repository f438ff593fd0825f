"""Who may do what to a saga: the one place that decides it. Pure.

The intake refuses what a role may never send (``may_send``); the coordinator, which knows the
saga, refuses what this sender may not do to this saga (``may_act``), and reads a register only
to whom may see it (``may_read``). Agents start sagas and may abort or ask about their own;
operators also resume, and decide at gates that do not require a person; only people resolve,
and decide at gates that do. The broker's topic permissions for each role are drawn from the
same table (``command_keys``, used by ``saga_coordinator.access``), so the broker refuses first
what the coordinator would refuse.
"""

from __future__ import annotations

from saga_coordinator.register import SagaState
from saga_shared.model.messages import Role, Sender

# What each role may ever send. "console" acts for the people signed in to it.
_SENDS: dict[Role, tuple[str, ...]] = {
    "agent": ("saga.start", "saga.status", "saga.abort"),
    "ops": ("saga.start", "saga.status", "saga.abort", "saga.resume", "saga.approve",
            "saga.reject", "dlq.replay", "dlq.discard"),
    "person": ("saga.start", "saga.status", "saga.abort", "saga.resume", "saga.approve",
               "saga.reject", "saga.resolve", "saga.settle", "dlq.replay", "dlq.discard"),
}  # fmt: skip
_SENDS["console"] = _SENDS["ops"]


def command_keys(role: Role) -> str:
    """The routing keys of the commands ``role`` may send, as the broker's topic permission:
    each under ``<type>.<partition>`` or its bare type. An agent's:
    ``^saga\\.(start|status|abort)(\\.[0-9]{1,4})?$``."""
    prefixes: dict[str, list[str]] = {}
    for command in _SENDS[role]:
        prefix, name = command.split(".", 1)
        prefixes.setdefault(prefix, []).append(name)
    types = "|".join(f"{prefix}\\.({'|'.join(names)})" for prefix, names in prefixes.items())
    grouped = types if len(prefixes) == 1 else f"({types})"
    return f"^{grouped}(\\.[0-9]{{1,4}})?$"


def may_send(role: Role, command_type: str) -> str | None:
    """None when ``role`` may send ``command_type``; otherwise why not."""
    if command_type in _SENDS.get(role, ()):
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
    if not may_read(state, sender):
        return f"saga {state.saga_id} was not started by {sender.user}"
    return None


def may_read(state: SagaState, sender: Sender | None) -> bool:
    """Whether ``sender`` may see this saga at all: an agent only the sagas it started."""
    if sender is None or sender.role != "agent":
        return True
    owner = state.started_by
    return owner is not None and owner.user == sender.user


def may_decide_gate(require_person: bool, sender: Sender | None) -> str | None:
    if sender is None or sender.role == "agent":
        return "an agent cannot decide at an approval gate"
    if require_person and sender.role != "person":
        return "this gate needs a person's decision, sent from that person's own account"
    return None
