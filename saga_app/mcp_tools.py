"""The catalog as Model Context Protocol tools, for an LLM agent (``saga mcp``).

The server acts as an agent and nothing more: it connects to the broker as an agent's account
and sends the same commands the client library sends, so the coordinator checks and records
them exactly as it does any agent's. There is no tool to approve, reject, resume, resolve,
replay or discard: those decisions are people's and operators', and an agent that could make
them would guard nothing. Every answer is plain JSON; a refusal is an answer (``admitted`` or
``accepted`` false, with the rule and the reason), not an error, so the model can correct its
plan and try again.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError
from pydantic_core import to_jsonable_python

from saga_coordinator.incident import incident, render_markdown
from saga_coordinator.register import SagaState
from saga_shared.client import CommandRejected, SagaClient
from saga_shared.config import Settings
from saga_shared.errors import InvalidMessage, PlanRejected
from saga_shared.model.catalog import ActionClass, Catalog
from saga_shared.model.gateway import admit
from saga_shared.model.messages import Gate, Plan, PlanStep, StartSaga
from saga_shared.security.identity import Directory
from saga_shared.transport.bus import Bus
from saga_shared.transport.codec import check_shape

MAX_WAIT_S = 300.0
# What each class means for the one who runs it: the model reads this before it acts.
MEANING: dict[ActionClass, str] = {
    ActionClass.READ_ONLY: "changes nothing; nothing to undo",
    ActionClass.COMPENSABLE: "undone exactly by its compensation if the saga fails later",
    ActionClass.COMPENSABLE_WITH_RESIDUE: (
        "undone by its compensation, but the customer still sees a trace (the residue)"
    ),
    ActionClass.IRREVERSIBLE: (
        "cannot be undone once it ran: the gateway requires it last or behind an approval gate "
        "that a person opens"
    ),
}
STOPPED = ("completed", "compensated", "needs_human", "resolved", "awaiting_approval")


class StepIn(BaseModel):
    """One step of an ad-hoc plan, as the model writes it."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    action: str = Field(description="a catalog action, e.g. 'payments.refund_charge'")
    gate: bool = Field(
        default=False,
        description="an approval gate before this step: the saga stops there until a person "
        "approves (required before an irreversible action that is not last)",
    )


def agent_bus(settings: Settings) -> Bus:
    """The broker connection of an agent: ``SAGA_ACT_AS`` (an agent's account, its password in
    the secrets directory) or ``SAGA_AMQP_URL``'s user. Refuses any account that is not an
    agent's: handing a person's or the operators' authority to a model would let it decide at
    the gates that exist to stop it."""
    if settings.identity == "shared":
        return Bus(settings)
    directory = Directory.from_settings(settings)
    if settings.secrets_dir:
        bus = Bus(settings, user=settings.act_as or directory.agent_user)
    else:
        bus = Bus(settings)
    role = directory.command_role(bus.user)
    if role != "agent":
        raise PermissionError(
            f"saga mcp acts as an agent; broker user {bus.user!r} is "
            f"{'no command sender' if role is None else 'a ' + role}: give an agent's account "
            "(SAGA_ACT_AS with SAGA_SECRETS_DIR, or SAGA_AMQP_URL)"
        )
    return bus


class SagaTools:
    """The tools' behaviour, apart from the protocol (tested on its own and through MCP)."""

    def __init__(self, catalog: Catalog, client: SagaClient | None = None) -> None:
        self.catalog = catalog
        self._client = client  # the MCP server connects it when its session starts

    @property
    def client(self) -> SagaClient:
        if self._client is None:
            raise RuntimeError("the tools are not connected to the broker yet")
        return self._client

    @client.setter
    def client(self, client: SagaClient | None) -> None:
        self._client = client

    def list_actions(self) -> dict[str, Any]:
        actions = {
            name: {
                "class": spec.action_class.value,
                "meaning": MEANING[spec.action_class],
                "description": spec.description,
                "compensation": spec.compensation,
                "residue": spec.residue or None,
                "params": {p: s.model_dump(exclude_defaults=True) for p, s in spec.params.items()},
                "result": list(spec.result),
            }
            for name, spec in sorted(self.catalog.actions.items())
        }
        return {"actions": actions}

    def list_sagas(self) -> dict[str, Any]:
        sagas = {
            name: {
                "description": spec.description,
                "steps": [
                    {
                        "action": a,
                        "class": self.catalog.actions[a].action_class.value,
                        "gate": a in spec.gates,
                    }
                    for a in spec.steps
                    if a in self.catalog.actions
                ],
                "compensation_priority": list(spec.compensation_priority),
            }
            for name, spec in sorted(self.catalog.sagas.items())
        }
        return {"sagas": sagas}

    def check_plan(
        self,
        order_id: str,
        saga: str | None = None,
        steps: list[StepIn] | None = None,
        params: dict[str, JsonValue] | None = None,
        compensation_priority: list[str] | None = None,
    ) -> dict[str, Any]:
        try:
            command = _start(order_id, saga, steps, params, compensation_priority)
            plan = admit(self.catalog, command)
        except PlanRejected as exc:
            return {"admitted": False, "rule": exc.rule, "step": exc.step, "reason": exc.detail}
        except REFUSALS as exc:
            return {**_refused("admitted", exc), "step": None}
        return {
            "admitted": True,
            "saga": plan.saga,
            "steps": [
                {
                    "action": s.action,
                    "class": s.spec.action_class.value,
                    "meaning": MEANING[s.spec.action_class],
                    "gate": s.gate is not None,
                }
                for s in plan.steps
            ],
        }

    async def start_saga(
        self,
        order_id: str,
        saga: str | None = None,
        steps: list[StepIn] | None = None,
        params: dict[str, JsonValue] | None = None,
        compensation_priority: list[str] | None = None,
    ) -> dict[str, Any]:
        try:
            command = _start(order_id, saga, steps, params, compensation_priority)
            saga_id = await self.client.start(
                command.saga, order_id=order_id, params=command.params, plan=command.plan,
                saga_id=command.saga_id,
            )  # fmt: skip
        except REFUSALS as exc:
            return _refused("accepted", exc)
        reply = self.client.last_reply
        parked = reply is not None and reply.type == "command.parked"
        return {
            "accepted": True,
            "saga_id": saga_id,
            "order_id": order_id,
            "waiting": reply.reason if parked and reply is not None else None,
        }

    async def get_saga(self, saga_id: str, order_id: str) -> dict[str, Any]:
        try:
            register = await self.client.status(saga_id, order_id=order_id)
        except REFUSALS as exc:
            return _refused("found", exc)
        state = SagaState.model_validate(register)
        return {
            "found": True,
            "status": state.status,
            "report": to_jsonable_python(incident(state)),
            "report_markdown": render_markdown(state),
        }

    async def wait_for_saga(
        self, saga_id: str, order_id: str, seconds: float = 30.0
    ) -> dict[str, Any]:
        """Until the saga finishes or stops for someone (an approval gate, needs_human)."""
        seconds = min(max(seconds, 0.0), MAX_WAIT_S)
        now = await self.get_saga(saga_id, order_id)
        if not now["found"] or now["status"] in STOPPED:
            return now
        try:
            await self.client.wait(saga_id, seconds, stops=True)
        except TimeoutError:
            return {**now, "timed_out": True}
        return await self.get_saga(saga_id, order_id)

    async def abort_saga(self, saga_id: str, order_id: str, reason: str) -> dict[str, Any]:
        try:
            await self.client.abort(saga_id, order_id=order_id, reason=reason)
        except REFUSALS as exc:
            return _refused("aborted", exc)
        return {"aborted": True, "saga_id": saga_id}


def _start(
    order_id: str,
    saga: str | None,
    steps: list[StepIn] | None,
    params: dict[str, JsonValue] | None,
    priority: list[str] | None,
) -> StartSaga:
    plan = None
    if steps:
        plan = Plan(
            steps=tuple(PlanStep(action=s.action, gate=Gate() if s.gate else None) for s in steps),
            compensation_priority=tuple(priority or ()),
        )
    # The coordinator's own checks, here first: a bad order id, a parameter nested too deep
    # or a number out of range is answered at once, not by a command the codec drops.
    check_shape(params or {})
    return StartSaga(
        saga_id=str(uuid.uuid4()), order_id=order_id, saga=saga, plan=plan,
        params=dict(params or {}),
    )  # fmt: skip


# What a tool answers as a refusal, never raises: the model reads the reason and corrects.
REFUSALS = (ValidationError, InvalidMessage, CommandRejected, TimeoutError)


def _refused(flag: str, exc: Exception) -> dict[str, Any]:
    if isinstance(exc, ValidationError):
        return {flag: False, "rule": "malformed", "reason": _why(exc)}
    if isinstance(exc, InvalidMessage):
        return {flag: False, "rule": "malformed", "reason": exc.reason}
    if isinstance(exc, TimeoutError):
        reason = "the coordinator did not answer in time: is the system running?"
        return {flag: False, "rule": "no_answer", "reason": reason}
    return {flag: False, "reason": str(exc)}


def _why(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or 'command'}: {e['msg']}" for e in exc.errors()
    )[:2000]


@asynccontextmanager
async def connected(settings: Settings, catalog: Catalog) -> AsyncIterator[SagaTools]:
    async with agent_bus(settings) as bus, SagaClient(bus) as client:
        yield SagaTools(catalog, client)


INSTRUCTIONS = (
    "Run multi-step writes in a customer's systems (stock, ERP, payments, e-mail) as sagas that "
    "are reversible by design. Read list_actions and list_sagas first: every action has a class "
    "saying what happens if a later step fails. Check a plan with check_plan before you start "
    "it; start_saga runs it, wait_for_saga follows it, get_saga shows its register (what was "
    "done, what was put back, what residue the customer sees, what never happened). If a step "
    "fails, the system compensates what landed, in reverse order, by rule: you never undo "
    "anything yourself. An irreversible action runs last or behind an approval gate that only a "
    "person can open; you cannot approve, resolve, replay or discard, and a saga stopped for a "
    "person stays stopped until one acts."
)

DESCRIBE = {
    "list_actions": (
        "Every action of the catalog: its class and what the class means "
        "if the saga fails later (read_only, compensable, compensable_with_residue, "
        "irreversible), its compensation, the residue a customer still sees after it "
        "is undone, its parameters with their bounds, and the result fields."
    ),
    "list_sagas": (
        "The named sagas: their steps in order with each step's class, "
        "the approval gates (a person must approve before that step runs), and the "
        "order in which compensations run first."
    ),
    "check_plan": (
        "Check a plan against the gateway WITHOUT running it: either a "
        "named saga or an ad-hoc list of steps, with its parameters. Answers admitted "
        "true with each step's class, or admitted false with the broken rule, the step "
        "and the reason, so you can fix the plan. Nothing is written anywhere."
    ),
    "start_saga": (
        "Start a saga (a named one, or an ad-hoc list of steps) for one "
        "order; one saga per order runs at a time, later ones wait. Writes to the "
        "customer's systems: compensable steps are undone automatically if a later "
        "step fails, residues stay visible, irreversible steps cannot be undone. "
        "Answers accepted with the saga_id, or the gateway's reason for refusing."
    ),
    "get_saga": (
        "A saga's register as it stands: status, every step with its "
        "identifiers, what was put back, what residue remains, what never happened, "
        "who decided what; also as a markdown incident report."
    ),
    "wait_for_saga": (
        "Wait (at most `seconds`, up to 300) until the saga completes, is "
        "compensated, needs a human, or stops at an approval gate; answers the register "
        "then. A saga stopped for a person stays stopped: tell the user, do not retry."
    ),
    "abort_saga": (
        "Abort a running saga (yours): forward progress stops and every "
        "step that may have landed is compensated by rule, in reverse order. Steps "
        "already irreversible stay done."
    ),
}


def build_server(settings: Settings, catalog: Catalog) -> Any:
    """The MCP server of these tools; it connects to the broker when the session starts."""
    from mcp.server.mcpserver import MCPServer  # the SDK is needed by `saga mcp` alone

    tools = SagaTools(catalog)

    @asynccontextmanager
    async def lifespan(_: Any) -> AsyncIterator[dict[str, Any]]:
        async with agent_bus(settings) as bus, SagaClient(bus) as client:
            tools.client = client
            try:
                yield {}
            finally:
                tools.client = None

    server = MCPServer("saga", instructions=INSTRUCTIONS, lifespan=lifespan)
    for name, description in DESCRIBE.items():
        server.add_tool(getattr(tools, name), name=name, description=description)
    return server
