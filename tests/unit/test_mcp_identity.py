"""`saga mcp` hands a model an agent's authority, never a person's or the operators'."""

from __future__ import annotations

import pytest

from saga_app.mcp_tools import agent_bus
from saga_shared.config import Settings


def roles(user: str) -> Settings:
    return Settings(amqp_url=f"amqp://{user}:pw@127.0.0.1:5672/", identity="roles",
                    people="alice")  # fmt: skip


def test_an_agent_account_is_taken() -> None:
    assert agent_bus(roles("saga-agent")).user == "saga-agent"
    assert agent_bus(roles("saga-agent-7")).user == "saga-agent-7"


@pytest.mark.parametrize("user", ["saga-ops", "alice", "saga-coordinator", "guest"])
def test_any_other_account_is_refused(user: str) -> None:
    with pytest.raises(PermissionError, match="acts as an agent"):
        agent_bus(roles(user))
