"""Parameter types of the built-in services' models.

The gateway checks parameters against the catalog at intake; the systems check again because
they are the last line of defence (a replayed or hand-written message skips the gateway).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be blank")
    return value


Text = Annotated[str, Field(min_length=1), AfterValidator(_not_blank)]


class Params(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
