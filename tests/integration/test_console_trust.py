"""The console acts for the people signed in to it, from its own broker account: only that
account may name a person (``x-on-behalf-of``), and the register records the person, via the
console. Every role on its own account, as in production."""

from __future__ import annotations

import asyncpg
import pytest

from saga_app.stack import Stack
from saga_shared.client import CommandRejected
from saga_shared.config import Settings
from tests.integration.deployment import Deployment
from tests.integration.test_gates_and_abort import CHECKOUT
from tests.integration.test_roles import As


async def test_only_the_console_may_act_for_a_person_and_the_register_says_via_whom(
    role_stack: Stack, role_settings: Settings, deployment: Deployment, pool: asyncpg.Pool,
    order_id: str,
) -> None:  # fmt: skip
    console, ops = deployment.user("console"), deployment.user("ops")
    ana = deployment.user("ana")  # a person: her console account carries her identity
    async with As(role_settings, deployment.user("agent")) as (_, agent):
        saga_id = await agent.start("checkout_approved", order_id=order_id, params=CHECKOUT)
        assert (await agent.wait(saga_id, seconds=30, stops=True)).type == "saga.awaiting_approval"
        with pytest.raises(CommandRejected, match="only the console may act on behalf"):
            await agent.on_behalf_of("ana").abort(saga_id, order_id=order_id, reason="as ana")
    async with As(role_settings, ops) as (_, operations):
        with pytest.raises(CommandRejected, match="only the console may act on behalf"):
            await operations.on_behalf_of("ana").approve(saga_id, order_id=order_id)
    async with As(role_settings, console) as (_, from_console):
        # on its own account the console is an operator: this gate needs a person
        with pytest.raises(CommandRejected, match="needs a person's decision"):
            await from_console.approve(saga_id, order_id=order_id, note="nobody signed in")
        with pytest.raises(CommandRejected, match="not a user name"):
            await from_console.on_behalf_of("ana\x00; drop").approve(saga_id, order_id=order_id)
        # an operator signed in to the console who is not in SAGA_PEOPLE is an operator
        with pytest.raises(CommandRejected, match="needs a person's decision"):
            await from_console.on_behalf_of("olga").approve(saga_id, order_id=order_id)
        await from_console.on_behalf_of(ana).approve(saga_id, order_id=order_id, note="ok")
        assert (await from_console.wait(saga_id, seconds=30)).type == "saga.completed"

    state = await role_stack.store.get(saga_id)
    assert state is not None and state.status == "completed"
    assert [(d.kind, d.by, d.role, d.note) for d in state.decisions] == [
        ("approve", ana, f"person via {console}", "ok")
    ]
    rules = await pool.fetch(
        "SELECT rule, sender FROM rejections WHERE saga_id = $1 ORDER BY id", saga_id
    )
    assert [(r["rule"], r["sender"]) for r in rules] == [
        ("not_permitted", deployment.user("agent")),
        ("not_permitted", ops),
        ("not_permitted", console),
        ("not_permitted", console),
        ("not_permitted", "olga"),  # as whom the console acted: an operator, refused the gate
    ]
