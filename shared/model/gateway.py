"""The gateway: pure checks that refuse plans breaking the rules, before anything runs.

Used at load time for the catalog's named sagas and at intake for every start command. Each
refusal names the rule (a stable identifier), the step and what is wrong.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    create_model,
)

from saga_shared.errors import CatalogError, PlanRejected
from saga_shared.model.catalog import (
    ActionClass,
    ActionSpec,
    Catalog,
    ParamSpec,
    answer_within_s,
    read_catalog,
    service_of,
)
from saga_shared.model.messages import Gate, Plan, StartSaga
from saga_shared.model.text import clean


def _no_bool(value: Any) -> Any:
    # Lax mode would read true as 1; a boolean for a number is a mistake worth naming.
    if isinstance(value, bool):
        raise ValueError("expected a number, not a boolean")
    return value


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be blank")
    return value


def _python_type(spec: ParamSpec) -> Any:
    """The pydantic type of one parameter, bounds included: a value the systems' columns could
    not take is refused here, before the saga starts, never by an adapter half-way through."""
    low, high = spec.bounds
    if spec.type == "int":
        return Annotated[int, BeforeValidator(_no_bool), Field(ge=int(low), le=int(high))]
    if spec.type == "float":
        return Annotated[
            float, BeforeValidator(_no_bool), Field(ge=low, le=high, allow_inf_nan=False)
        ]
    if spec.type == "bool":
        return bool
    text = Annotated[str, Field(min_length=spec.min_length, max_length=spec.max_length)]
    return Annotated[text, AfterValidator(_not_blank)] if spec.min_length else text


@dataclass(frozen=True)
class Deadlines:
    """Per send: the adapter's own timeout, and how long the coordinator waits for an answer."""

    timeout_s: float
    answer_within_s: float
    sends: int


@dataclass(frozen=True)
class AdmittedStep:
    index: int
    action: str
    spec: ActionSpec
    params: dict[str, Any]
    forward: Deadlines
    compensation: Deadlines
    gate: Gate | None = None


@dataclass(frozen=True)
class AdmittedPlan:
    saga: str
    steps: tuple[AdmittedStep, ...]
    compensation_priority: tuple[str, ...]


def check_action(catalog: Catalog, name: str, spec: ActionSpec) -> None:
    """Rules about one declared action (independent of any plan)."""
    service = service_of(name)
    if spec.action_class.needs_compensation:
        if spec.compensation is None:
            raise PlanRejected(
                "compensation_missing", f"{name} is {spec.action_class} but names no compensation"
            )
        if spec.compensation not in catalog.compensations:
            raise PlanRejected(
                "compensation_unknown",
                f"{name} names compensation {spec.compensation!r}, which the catalog lacks",
            )
        if service_of(spec.compensation) != service:
            raise PlanRejected(
                "compensation_service", f"{name}: its compensation must be served by {service!r}"
            )
    elif spec.compensation is not None:
        raise PlanRejected(
            "compensation_unexpected", f"{name} is {spec.action_class} and cannot be compensated"
        )
    if spec.action_class is ActionClass.COMPENSABLE_WITH_RESIDUE and not spec.residue.strip():
        raise PlanRejected("residue_missing", f"{name} leaves a residue but does not state it")


def check_plan(
    catalog: Catalog,
    steps: Sequence[str],
    priority: Sequence[str] = (),
    gated: Collection[str] = (),
) -> None:
    """Rules about an ordered plan. Raises ``PlanRejected`` at the first broken rule.
    ``gated``: the actions with an approval gate directly before them."""
    seen: set[str] = set()
    undoers: dict[str, str] = {}
    last_compensable: int | None = None
    for index, name in enumerate(steps):
        spec = catalog.actions.get(name)
        if spec is None:
            rule = "compensation_as_step" if name in catalog.compensations else "unknown_action"
            raise PlanRejected(rule, f"{name!r} is not a declared action", step=index)
        if name in seen:
            # The idempotency key is saga_id:action, so one action may appear once per saga.
            raise PlanRejected("duplicate_action", f"{name} appears twice", step=index)
        seen.add(name)
        try:
            check_action(catalog, name, spec)
        except PlanRejected as exc:
            raise PlanRejected(exc.rule, exc.detail, step=index) from None
        if spec.action_class.needs_compensation:
            last_compensable = index
            assert spec.compensation is not None  # check_action made sure of it
            if spec.compensation in undoers:
                # Its idempotency key is saga_id:compensation: two undos would share one key.
                raise PlanRejected(
                    "duplicate_compensation",
                    f"{name} and {undoers[spec.compensation]} share {spec.compensation}",
                    step=index,
                )
            undoers[spec.compensation] = name
    for index, name in enumerate(steps):
        spec = catalog.actions[name]
        if (
            spec.action_class is ActionClass.IRREVERSIBLE
            and last_compensable is not None
            and index < last_compensable
            and name not in gated
        ):
            raise PlanRejected(
                "irreversible_not_last",
                f"irreversible {name} runs before compensable {steps[last_compensable]} "
                f"(step {last_compensable}); irreversible actions go last, or behind an "
                "approval gate",
                step=index,
            )
    for name in gated:
        if name not in seen:
            raise PlanRejected("gate_unknown", f"a gate stands before {name!r}, not in the plan")
    for name in priority:
        if name not in seen:
            raise PlanRejected(
                "priority_unknown", f"compensation_priority names {name!r}, not in the plan"
            )


def check_catalog(catalog: Catalog, *, source: str = "catalog") -> None:
    for name, spec in catalog.actions.items():
        try:
            check_action(catalog, name, spec)
        except PlanRejected as exc:
            raise CatalogError(f"{source}: action {name}: {exc.detail} [{exc.rule}]") from None
    for saga, definition in catalog.sagas.items():
        try:
            check_plan(
                catalog, definition.steps, definition.compensation_priority, definition.gates
            )
        except PlanRejected as exc:
            where = (
                f"step {exc.step} ({definition.steps[exc.step]})" if exc.step is not None else ""
            )
            raise CatalogError(
                f"{source}: saga {saga!r}{' ' if where else ''}{where}: {exc.detail} [{exc.rule}]"
            ) from None


@functools.lru_cache(maxsize=256)
def _params_model(kinds: tuple[tuple[str, ParamSpec], ...]) -> type[BaseModel]:
    """One model per parameter list: building a pydantic model costs more than validating."""
    fields: dict[str, Any] = {key: (_python_type(spec), ...) for key, spec in kinds}
    return create_model("SagaParams", __config__=ConfigDict(extra="forbid"), **fields)


def validate_params(
    catalog: Catalog, steps: Sequence[str], params: Mapping[str, Any]
) -> tuple[dict[str, Any], ...]:
    """Validate the saga's flat parameters against every step's schema; return each step's own."""
    kinds: dict[str, ParamSpec] = {}
    for name in steps:
        kinds.update(catalog.actions[name].params)
    model = _params_model(tuple(kinds.items()))
    try:
        valid = model.model_validate(dict(params)).model_dump()
    except ValidationError as exc:
        problems = "; ".join(
            clean(f"params.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}", 300)
            for e in exc.errors(include_url=False, include_input=False)[:10]
        )
        raise PlanRejected("params_invalid", problems) from None
    return tuple({k: valid[k] for k in catalog.actions[name].params} for name in steps)


def _deadlines(catalog: Catalog, action: str) -> tuple[Deadlines, Deadlines]:
    spec = catalog.actions[action]
    forward = Deadlines(spec.timeout_s, answer_within_s(spec.timeout_s, spec.retry), spec.sends)
    undo = catalog.compensations.get(spec.compensation) if spec.compensation else None
    if undo is None:
        return forward, forward
    return forward, Deadlines(
        undo.timeout_s, answer_within_s(undo.timeout_s, undo.retry), undo.sends
    )


def admit(catalog: Catalog, command: StartSaga) -> AdmittedPlan:
    """Everything the gateway checks for a start command; the admitted plan snapshots the
    catalog so that editing the catalog later never changes a saga already running."""
    if command.saga is not None:
        definition = catalog.sagas.get(command.saga)
        if definition is None:
            known = ", ".join(sorted(catalog.sagas)) or "none"
            raise PlanRejected("unknown_saga", f"no saga named {command.saga!r} (known: {known})")
        name, steps, priority = command.saga, definition.steps, definition.compensation_priority
        gates = dict(definition.gates)
    else:
        plan: Plan | None = command.plan
        assert plan is not None  # the message model guarantees exactly one of saga/plan
        name = "adhoc"
        steps = tuple(s.action for s in plan.steps)
        priority = plan.compensation_priority
        gates = {s.action: s.gate for s in plan.steps if s.gate is not None}
    check_plan(catalog, steps, priority, gates)
    per_step = validate_params(catalog, steps, command.params)
    return AdmittedPlan(
        saga=name,
        steps=tuple(
            AdmittedStep(i, a, catalog.actions[a], p, *_deadlines(catalog, a), gates.get(a))
            for i, (a, p) in enumerate(zip(steps, per_step, strict=True))
        ),
        compensation_priority=tuple(priority),
    )


def load_catalog(path: Path) -> Catalog:
    """Read, validate and check a catalog file; raise ``CatalogError`` naming what is wrong."""
    catalog = read_catalog(path)
    check_catalog(catalog, source=str(path))
    return catalog
