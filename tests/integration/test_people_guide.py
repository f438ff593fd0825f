"""The people's-queue guide (docs/how-to/people.md), through the `saga` CLI against a stack in
``roles`` mode, every account its own, as the guide's session ran: an operations account is
refused at a gate that needs a person, the person's own account approves; a person aborts."""

from __future__ import annotations

import json

from saga_app.stack import Stack
from saga_shared.config import Settings
from tests.integration.deployment import Deployment
from tests.integration.test_cli import saga, saga_json
from tests.integration.test_gates_and_abort import CHECKOUT


def params() -> list[str]:
    return [a for k, v in CHECKOUT.items() for a in ("--param", f"{k}={v}")]


async def at_the_gate(agent: Settings, order_id: str) -> dict[str, str]:
    """`saga start --wait` as the agent: it stops at the gate, exit 4, as the guide says."""
    code, out, err = await saga(agent, "start", "checkout_approved", "--order", order_id,
                                *params(), "--wait", "30", "--json")  # fmt: skip
    assert code == 4, (code, out, err)
    started: dict[str, str] = json.loads(out)
    assert started["status"] == "awaiting_approval"
    return started


async def test_the_peoples_queue_session_runs_as_written(
    role_stack: Stack, role_settings: Settings, deployment: Deployment, order_id: str
) -> None:
    agent = role_settings.with_(act_as=deployment.user("agent"))
    ana = role_settings.with_(act_as=deployment.user("ana"))
    first, second = [await at_the_gate(agent, f"{order_id}-{i}") for i in range(2)]
    waiting = await saga_json(role_settings, "list", "--status", "awaiting_approval")
    assert {first["saga_id"], second["saga_id"]} <= {r["saga_id"] for r in waiting}

    code, out, err = await saga(role_settings, "approve", first["saga_id"],
                                "--note", "automation says yes")  # fmt: skip
    assert code != 0 and "this gate needs a person's decision" in out + err, (code, out, err)
    code, out, err = await saga(ana, "approve", first["saga_id"],
                                "--note", "address confirmed by phone", "--wait", "30")  # fmt: skip
    assert code == 0 and "status: completed" in out, (code, out, err)
    assert f"approve by {deployment.user('ana')} (person): address confirmed by phone" in out

    why = "customer cancelled on the phone"
    code, out, err = await saga(ana, "abort", second["saga_id"], "--reason", why, "--wait", "30")
    assert code == 0 and "status: compensated" in out, (code, out, err)
    assert "reason: aborted: customer cancelled on the phone" in out
