"""The how-to's example of gates and a person's decision (docs/examples/gates.py, included in
docs/how-to/agents.md) runs as written against a stack whose every part has its own account,
the agent and the person each on theirs, and prints what the page shows (gates.out)."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from saga_app.stack import Stack
from saga_shared.config import Settings
from tests.integration.deployment import Deployment

EXAMPLES = Path(__file__).resolve().parents[2] / "docs/examples"


async def test_the_gates_example_prints_what_the_page_shows(
    role_stack: Stack, role_settings: Settings, deployment: Deployment, order_id: str,
    tmp_path: Path,
) -> None:  # fmt: skip
    env = {
        "PATH": os.environ["PATH"],
        "SAGA_AMQP_URL": role_settings.amqp_url, "SAGA_NAMESPACE": role_settings.namespace,
        "SAGA_PARTITIONS": str(role_settings.partitions), "SAGA_IDENTITY": "roles",
        "SAGA_SECRETS_DIR": role_settings.secrets_dir,
        "SAGA_USER_PREFIX": role_settings.user_prefix,
        "SAGA_AGENTS": role_settings.agents, "SAGA_PEOPLE": role_settings.people,
        "SAGA_EXAMPLE_AGENT": deployment.user("agent"),
        "SAGA_EXAMPLE_PERSON": deployment.user("ana"),
    }  # fmt: skip
    example = await asyncio.create_subprocess_exec(
        sys.executable, EXAMPLES / "gates.py", order_id, cwd=tmp_path, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(example.communicate(), 120)  # the stack runs meanwhile
    assert example.returncode == 0, err.decode()
    assert out.decode() == (EXAMPLES / "gates.out").read_text()
