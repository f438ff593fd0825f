"""The committed contract (schemas/) is what the models generate today."""

from __future__ import annotations

import json
from pathlib import Path

from saga_shared.transport.contract import asyncapi, json_schemas

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"


def test_committed_schemas_are_not_stale() -> None:
    expected = {**json_schemas(), "asyncapi.json": asyncapi()}
    committed = {p.name: json.loads(p.read_text()) for p in SCHEMAS.glob("*.json")}

    assert sorted(committed) == sorted(expected), "run `saga schema export` and commit schemas/"
    for name, document in expected.items():
        assert committed[name] == document, f"{name} is stale: run `saga schema export`"


def test_asyncapi_names_every_command_and_the_public_events() -> None:
    doc = asyncapi()
    channels = doc["channels"]
    for command in ("start", "abort", "resume", "resolve", "approve", "reject", "status"):
        assert f"saga.commands/saga.{command}" in channels
    assert "saga.events/{eventType}" in channels
    assert set(doc["components"]["schemas"]) >= {"saga.start", "saga.event", "action.done"}
