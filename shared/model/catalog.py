"""The catalog: declared actions, compensations and named sagas, loaded from a TOML file.

Loading runs every gateway check (``saga_shared.model.gateway``), so a catalog that breaks a rule
never starts a process: the error names the saga, the step and the rule."""

from __future__ import annotations

import tomllib
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from saga_shared.errors import CatalogError
from saga_shared.model.messages import Gate, ParamName

ParamType = Literal["str", "int", "float", "bool"]
Name = Annotated[str, Field(pattern=r"^[a-z0-9_]+\.[a-z0-9_]+$")]


class ActionClass(StrEnum):
    READ_ONLY = "read_only"
    COMPENSABLE = "compensable"
    COMPENSABLE_WITH_RESIDUE = "compensable_with_residue"
    IRREVERSIBLE = "irreversible"

    @property
    def needs_compensation(self) -> bool:
        return self in (ActionClass.COMPENSABLE, ActionClass.COMPENSABLE_WITH_RESIDUE)


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class RetryPolicy(_Strict):
    attempts: int = Field(default=3, ge=1, le=20)
    initial_backoff_s: float = Field(default=0.05, gt=0, le=60)
    max_backoff_s: float = Field(default=2.0, gt=0, le=600)


def answer_within_s(timeout_s: float, retry: RetryPolicy) -> float:
    """How long the coordinator waits for an outcome before it sends the request again: every
    adapter attempt may take the whole timeout, with the backoffs between them, plus a margin."""
    return timeout_s * retry.attempts + retry.max_backoff_s * (retry.attempts - 1) + 2.0


# What a parameter may hold when the catalog says nothing more: integers that fit a Postgres
# integer column, finite floats of a sane size, strings of 1 to 1,000 characters.
INT_MIN, INT_MAX = -(2**31), 2**31 - 1
FLOAT_LIMIT = 1e15


class ParamSpec(_Strict):
    """One parameter: ``quantity = "int"`` or ``quantity = { type = "int", min = 1, max = 99 }``."""

    type: ParamType
    min: float | None = None
    max: float | None = None
    min_length: int = Field(default=1, ge=0, le=100_000)
    max_length: int = Field(default=1000, ge=1, le=100_000)

    @model_validator(mode="after")
    def _sane(self) -> ParamSpec:
        low, high = self.bounds
        if low > high:
            raise ValueError(f"min {low} is above max {high}")
        if self.min_length > self.max_length:
            raise ValueError("min_length is above max_length")
        if self.type == "int" and (low < INT_MIN * 2**32 or high > INT_MAX * 2**32):
            raise ValueError("int bounds must fit in 64 bits")
        return self

    @property
    def bounds(self) -> tuple[float, float]:
        default = (INT_MIN, INT_MAX) if self.type == "int" else (-FLOAT_LIMIT, FLOAT_LIMIT)
        low = default[0] if self.min is None else self.min
        high = default[1] if self.max is None else self.max
        return low, high


def _param_specs(value: object) -> object:
    if isinstance(value, dict):
        return {k: {"type": v} if isinstance(v, str) else v for k, v in value.items()}
    return value


class ActionSpec(_Strict):
    action_class: ActionClass = Field(alias="class")
    description: str = ""
    compensation: Name | None = None
    residue: str = ""
    params: Annotated[dict[ParamName, ParamSpec], BeforeValidator(_param_specs)] = Field(
        default_factory=dict
    )
    result: tuple[str, ...] = ()
    timeout_s: float = Field(default=10.0, gt=0, le=3600)
    retry: RetryPolicy = RetryPolicy()
    # How many times the coordinator sends the request (same idempotency key) when no outcome
    # comes back in time; after the last, the step counts as failed with an unknown effect.
    sends: int = Field(default=3, ge=1, le=20)


class CompensationSpec(_Strict):
    description: str = ""
    timeout_s: float = Field(default=10.0, gt=0, le=3600)
    retry: RetryPolicy = RetryPolicy()
    sends: int = Field(default=3, ge=1, le=20)


class SagaSpec(_Strict):
    description: str = ""
    steps: tuple[Name, ...] = Field(min_length=1)
    compensation_priority: tuple[Name, ...] = ()
    # Approval gates, by the action they stand before.
    gates: dict[Name, Gate] = Field(default_factory=dict)


def service_of(name: str) -> str:
    """The service an action or compensation belongs to: ``service.name``'s first part."""
    return name.split(".", 1)[0]


class Catalog(_Strict):
    actions: dict[Name, ActionSpec]
    compensations: dict[Name, CompensationSpec] = Field(default_factory=dict)
    sagas: dict[str, SagaSpec] = Field(default_factory=dict)

    @property
    def services(self) -> tuple[str, ...]:
        """The services the catalog's actions and compensations belong to (``service.name``):
        each gets an action queue and an adapter."""
        names = [*self.actions, *self.compensations]
        return tuple(sorted({service_of(name) for name in names}))

    def retry_policy(self, action: str) -> RetryPolicy:
        spec = self.actions.get(action) or self.compensations.get(action)
        return spec.retry if spec is not None else RetryPolicy()


def read_catalog(path: Path) -> Catalog:
    """Read and validate a catalog file (the gateway's rules are ``gateway.load_catalog``'s)."""
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CatalogError(f"{path}: cannot read the catalog: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise CatalogError(f"{path}: not valid TOML: {exc}") from None
    try:
        return Catalog.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        raise CatalogError(f"{path}: {problems}") from None
