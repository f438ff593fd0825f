"""`saga mcp` through the MCP SDK's own client, over stdio, against a running stack: what an
LLM agent sees and may do."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
from collections.abc import AsyncIterator
from typing import Any

from mcp import Client
from mcp.client.stdio import StdioServerParameters

from saga_app.stack import Stack
from saga_shared.config import Settings
from tests.integration.helpers import REFUND, saga_env
from tests.integration.test_gates_and_abort import CHECKOUT
from tests.ports import free_port

TOOLS = {
    "list_actions", "list_sagas", "check_plan", "start_saga", "get_saga", "wait_for_saga",
    "abort_saga",
}  # fmt: skip


@contextlib.asynccontextmanager
async def connected(settings: Settings) -> AsyncIterator[Client]:
    """`saga mcp` started by the client, as an MCP host would. (Not a fixture: the SDK's task
    group must be entered and left in the same task.)"""
    server = StdioServerParameters(
        command=sys.executable, args=["-m", "saga_app.cli", "mcp"], env=saga_env(settings)
    )
    async with Client(server, read_timeout_seconds=60) as client:
        yield client


async def call(agent: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await agent.call_tool(tool, arguments)
    assert not result.is_error, result.content
    assert isinstance(result.structured_content, dict)
    return result.structured_content


async def test_the_tools_say_what_can_be_undone_and_none_decides_for_a_person(
    stack: Stack,
    settings: Settings,
) -> None:
    async with connected(settings) as agent:
        tools = {t.name: t for t in (await agent.list_tools()).tools}
        assert set(tools) == TOOLS  # no approve, reject, resume, resolve, replay or discard
        assert "cannot be undone" in (tools["start_saga"].description or "")
        actions = (await call(agent, "list_actions"))["actions"]
        email = actions["email.send_customer_email"]
        assert email["class"] == "irreversible" and "cannot be undone" in email["meaning"]
        assert actions["inventory.reserve_stock"]["compensation"] == "inventory.release_stock"
        assert actions["payments.charge_card"]["params"]["amount_cents"]["type"] == "int"
        sagas = (await call(agent, "list_sagas"))["sagas"]
        gated = [s for s in sagas["checkout_approved"]["steps"] if s["gate"]]
        assert [s["action"] for s in gated] == ["email.send_confirmation"]


async def test_a_plan_that_breaks_a_rule_is_refused_with_its_reason(
    stack: Stack, settings: Settings, order_id: str
) -> None:
    async with connected(settings) as agent:
        steps = [{"action": "email.send_customer_email"}, {"action": "inventory.reserve_stock"}]
        checked = await call(agent, "check_plan", order_id=order_id, steps=steps, params=REFUND)
        assert checked["admitted"] is False
        assert checked["rule"] == "irreversible_not_last" and checked["step"] == 0
        started = await call(agent, "start_saga", order_id=order_id, steps=steps, params=REFUND)
        assert started["accepted"] is False and "irreversible_not_last" in started["reason"]
        bad = await call(agent, "check_plan", order_id="A\x00", saga="refund", params=REFUND)
        assert bad["admitted"] is False and bad["rule"] == "malformed"
        deep: dict[str, Any] = {}
        for _ in range(40):
            deep = {"a": deep}
        nested = await call(agent, "start_saga", order_id=order_id, saga="refund", params=deep)
        assert nested["accepted"] is False and nested["rule"] == "malformed"
        assert "nested deeper than" in nested["reason"]  # answered at once, nothing sent
        gated = [{"action": "email.send_customer_email", "gate": True}, steps[1]]
        params = {k: REFUND[k] for k in ("customer_email", "sku", "quantity")}
        fixed = await call(agent, "check_plan", order_id=order_id, steps=gated, params=params)
        assert fixed["admitted"] is True, fixed


async def test_a_refund_started_by_the_agent_completes(
    stack: Stack, settings: Settings, order_id: str
) -> None:
    async with connected(settings) as agent:
        started = await call(agent, "start_saga", order_id=order_id, saga="refund", params=REFUND)
        assert started["accepted"] is True
        done = await call(
            agent, "wait_for_saga", saga_id=started["saga_id"], order_id=order_id, seconds=60
        )
        assert done["status"] == "completed"
        report = done["report"]
        assert [s["action"] for s in report["done"]] == [
            "inventory.reserve_stock", "erp.create_credit_note", "email.send_customer_email",
        ]  # fmt: skip
        assert "# Saga" in done["report_markdown"]


async def test_a_gated_checkout_stops_and_stays_stopped(
    stack: Stack, settings: Settings, order_id: str
) -> None:
    async with connected(settings) as agent:
        started = await call(
            agent, "start_saga", order_id=order_id, saga="checkout_approved", params=CHECKOUT
        )
        sid = started["saga_id"]
        stopped = await call(agent, "wait_for_saga", saga_id=sid, order_id=order_id, seconds=60)
        assert stopped["status"] == "awaiting_approval"
        again = await call(agent, "wait_for_saga", saga_id=sid, order_id=order_id, seconds=2)
        assert again["status"] == "awaiting_approval"  # nobody approved: the agent cannot
        emails = list(again["report"]["never_happened"])
        assert any("email.send_confirmation" in str(s) for s in emails)


async def test_streamable_http_serves_the_same_tools(stack: Stack, settings: Settings) -> None:
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "saga_app.cli", "mcp", "--transport", "streamable-http",
        "--bind", f"127.0.0.1:{port}", env=saga_env(settings),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}/mcp"
        for _ in range(200):  # until it listens
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            await asyncio.sleep(0.1)
        async with Client(url, read_timeout_seconds=60) as agent:
            tools = {t.name for t in (await agent.list_tools()).tools}
            assert tools == TOOLS
            sagas = await call(agent, "list_sagas")
            assert "refund" in sagas["sagas"]
    finally:
        proc.terminate()
        await proc.wait()


async def test_an_unreachable_system_is_a_clear_error_not_a_dead_session(
    settings: Settings,
) -> None:
    env = {**saga_env(settings), "SAGA_NAMESPACE": "nosuchsystem"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "saga_app.cli", "mcp", env=env,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 1
    assert out == b""  # stdout is the protocol's: nothing else may go there
    assert b"cannot reach the saga system" in err and b"Traceback" not in err
