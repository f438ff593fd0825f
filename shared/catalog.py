"""The catalog: declared actions, compensations and named sagas, loaded from a TOML file.

Loading runs every gateway check (``shared.gateway``), so a catalog that breaks a rule never
starts a process: the error names the saga, the step and the rule.
"""

from __future__ import annotations

import tomllib
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from shared.errors import CatalogError
from shared.messages import Gate

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


class ActionSpec(_Strict):
    action_class: ActionClass = Field(alias="class")
    description: str = ""
    compensation: Name | None = None
    residue: str = ""
    params: dict[str, ParamType] = Field(default_factory=dict)
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


class Catalog(_Strict):
    actions: dict[Name, ActionSpec]
    compensations: dict[Name, CompensationSpec] = Field(default_factory=dict)
    sagas: dict[str, SagaSpec] = Field(default_factory=dict)

    def retry_policy(self, action: str) -> RetryPolicy:
        spec = self.actions.get(action) or self.compensations.get(action)
        return spec.retry if spec is not None else RetryPolicy()


def load_catalog(path: Path) -> Catalog:
    """Read, validate and check a catalog file; raise ``CatalogError`` naming what is wrong."""
    from shared.gateway import check_catalog  # the gateway depends on the models above

    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CatalogError(f"{path}: cannot read the catalog: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise CatalogError(f"{path}: not valid TOML: {exc}") from None
    try:
        catalog = Catalog.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        raise CatalogError(f"{path}: {problems}") from None
    check_catalog(catalog, source=str(path))
    return catalog
