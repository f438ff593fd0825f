"""Each console role against each action, in Chromium, on a stack in ``roles`` mode (every
component on its own account, as in production):

| action                         | viewer | operator (not in SAGA_PEOPLE)  | person |
|--------------------------------|--------|--------------------------------|--------|
| approve, reject at a gate that | 403    | not offered; a form made by    | done   |
| needs a person; resolve        |        | hand is refused by coordinator |        |
| resume, abort, abort a list    | 403    | done                           | done   |
| replay, discard a dead letter  | 403    | done                           | done   |

(Settling a step in doubt, person only, is in ``test_doubt``.)"""

from __future__ import annotations

import html
import re

import asyncpg
from playwright.async_api import Browser, Page, expect

from saga_app.stack import Stack
from saga_services.faults import add_fault
from saga_shared.client import SagaClient
from saga_shared.config import Settings
from tests.integration.browser import shot, sign_in
from tests.integration.console_kit import PASSWORDS
from tests.integration.deployment import Deployment
from tests.integration.helpers import REFUND, eventually, publish_start, terminal
from tests.integration.sabotage import Sabotage
from tests.integration.test_gates_and_abort import CHECKOUT
from tests.integration.test_roles import As

FIELD = {"approve": "note", "reject": "reason", "abort": "reason", "resume": "note",
         "resolve": "note"}  # fmt: skip
HAND_MADE = """async ([path, fields]) => {
    const csrf = document.querySelector("input[name=csrf]").value;
    const r = await fetch(path, {method: "POST", body: new URLSearchParams({csrf, ...fields})});
    return [r.status, await r.text()];
}"""


class Desk:
    """One person's browser tab on the console."""

    def __init__(self, page: Page, base: str) -> None:
        self.page, self.base = page, base

    async def decide(self, saga_id: str, decision: str, text: str) -> str:
        """As a person would: the button when offered, then the confirmation if asked; else the
        form a hand could make with this session's token. What the console answered."""
        await self.page.goto(f"{self.base}/sagas/{saga_id}")
        button = self.page.get_by_role("button", name=decision.capitalize(), exact=True)
        if not await button.count():
            return await self.by_hand(f"/sagas/{saga_id}/{decision}", {"text": text})
        await self.page.get_by_label(f"{decision} {FIELD[decision]}").fill(text)
        return await self._submit(button)

    async def by_hand(self, path: str, fields: dict[str, str]) -> str:
        status, body = await self.page.evaluate(HAND_MADE, [path, {**fields, "confirmed": "yes"}])
        flash = re.search(r'class="flash[^"]*"[^>]*>([^<]*)<', body)
        return f"{status}: {html.unescape(flash.group(1) if flash else body[-300:])}"

    async def _submit(self, button: object) -> str:
        async with self.page.expect_navigation():
            await button.click()  # type: ignore[attr-defined]
        yes = self.page.get_by_role("button", name="Yes, do it")
        if await yes.count():
            async with self.page.expect_navigation():
                await yes.click()
        return f"200: {await self.page.locator('.flash').first.inner_text()}"

    async def letter(self, dl_id: int, verb: str) -> str:
        await self.page.goto(f"{self.base}/dead-letters/{dl_id}")
        button = self.page.get_by_role("button", name=verb.capitalize(), exact=True)
        if not await button.count():
            fields = {"id": str(dl_id)} if verb == "replay" else {"reason": "by hand"}
            path = "/dead-letters/replay" if verb == "replay" else f"/dead-letters/{dl_id}/discard"
            return await self.by_hand(path, fields)
        if verb == "discard":
            await self.page.get_by_label("discard reason").fill("a duplicate, nothing to redo")
        return await self._submit(button)

    async def abort_list(self, order_id: str) -> str:
        await self.page.goto(f"{self.base}/sagas?order={order_id}")
        button = self.page.get_by_role("button", name=re.compile("Abort every saga"))
        if not await button.count():
            return await self.by_hand("/sagas/abort-all", {"order": order_id, "reason": "x"})
        await self.page.get_by_label("bulk abort reason").fill("the customer cancelled")
        async with self.page.expect_navigation():
            await button.click()
        await expect(self.page.locator("h1")).to_have_text("Abort 1 saga(s)?")
        await shot(self.page, "bulk-abort-confirm")
        async with self.page.expect_navigation():
            await self.page.get_by_role("button", name="Yes, do it").click()
        return f"200: {await self.page.locator('.flash').first.inner_text()}"


async def desks(browser: Browser, base: str, names: dict[str, str]) -> dict[str, Desk]:
    opened = {}
    for role, name in names.items():
        page = await (await browser.new_context(viewport={"width": 1360, "height": 900})).new_page()
        await sign_in(page, base, name, password=PASSWORDS[role])
        opened[role] = Desk(page, base)
    return opened


async def gated(agent: SagaClient, order_id: str) -> str:
    saga_id = await agent.start("checkout_approved", order_id=order_id, params=CHECKOUT)
    assert (await agent.wait(saga_id, seconds=30, stops=True)).type == "saga.awaiting_approval"
    return saga_id


async def status(stack: Stack, saga_id: str, *wanted: str) -> str:
    state = await eventually(
        lambda: stack.store.get(saga_id), lambda s: s is not None and s.status in wanted
    )
    assert state is not None
    return state.status


async def test_each_role_against_each_decision(
    role_console: tuple[Stack, str, dict[str, str]], role_settings: Settings,
    deployment: Deployment, browser: Browser, pool: asyncpg.Pool, order_id: str,
) -> None:  # fmt: skip
    stack, base, names = role_console
    desk = await desks(browser, base, names)
    async with As(role_settings, deployment.user("agent")) as (_, agent):
        g1, g2, g3, g4, g5 = [await gated(agent, f"{order_id}-g{i}") for i in range(1, 6)]
        for action in ("email.send_customer_email", "erp.void_credit_note"):
            await add_fault(pool, action, f"{order_id}-n", "permanent")
        n1 = await agent.start("refund", order_id=f"{order_id}-n", params=REFUND)
        assert (await agent.wait(n1, seconds=30)).type == "saga.needs_human"

    # every component beats on its own account, and the console reads them as the reader
    health = desk["viewer"].page
    await health.goto(f"{base}/health")
    alive = health.locator("#processes tr[data-state=alive]")
    await expect(alive).to_have_count(5)  # the coordinator and the four adapters

    for decision in ("approve", "reject", "abort"):
        assert "403: " in await desk["viewer"].decide(g1, decision, "as a viewer")
    for decision in ("approve", "reject"):
        said = await desk["operator"].decide(g1, decision, "as an operator")
        assert "this gate needs a person's decision" in said, said
    assert (await stack.store.get(g1)).decisions == ()  # type: ignore[union-attr]
    assert "accepted by the coordinator" in await desk["person"].decide(g1, "approve", "ok")
    assert "accepted by the coordinator" in await desk["person"].decide(g2, "reject", "no")
    assert "accepted by the coordinator" in await desk["operator"].decide(g3, "abort", "stop")
    assert "accepted by the coordinator" in await desk["person"].decide(g4, "abort", "stop")
    assert "403: " in await desk["viewer"].abort_list(f"{order_id}-g5")
    assert "abort: 1 of 1 accepted" in await desk["operator"].abort_list(f"{order_id}-g5")

    for decision in ("resume", "resolve"):
        assert "403: " in await desk["viewer"].decide(n1, decision, "as a viewer")
    said = await desk["operator"].decide(n1, "resolve", "as an operator")
    assert "refused: only a person may resolve a saga" in said, said
    assert "accepted by the coordinator" in await desk["operator"].decide(n1, "resume", "again")
    await status(stack, n1, "needs_human")  # the ERP still refuses: back to a person
    assert "accepted by the coordinator" in await desk["person"].decide(n1, "resume", "again")
    await status(stack, n1, "needs_human")
    assert "accepted by the coordinator" in await desk["person"].decide(n1, "resolve", "by hand")

    ends = {s: await status(stack, s, "completed", "compensated", "resolved")
            for s in (g1, g2, g3, g4, g5, n1)}  # fmt: skip
    assert ends == {g1: "completed", g2: "compensated", g3: "compensated", g4: "compensated",
                    g5: "compensated", n1: "resolved"}  # fmt: skip
    who = {s: [(d.kind, d.by) for d in (await terminal(stack, s)).decisions] for s in ends}
    person, operator = names["person"], names["operator"]
    assert who == {
        g1: [("approve", person)], g2: [("reject", person)], g3: [("abort", operator)],
        g4: [("abort", person)], g5: [("abort", operator)],
        n1: [("resume", operator), ("resume", person), ("resolve", person)],
    }  # fmt: skip


async def test_each_role_against_each_dead_letter_action(
    role_console: tuple[Stack, str, dict[str, str]], role_settings: Settings,
    deployment: Deployment, browser: Browser, sabotage: Sabotage, pool: asyncpg.Pool,
    order_id: str,
) -> None:  # fmt: skip
    stack, base, names = role_console
    desk = await desks(browser, base, names)
    orders = [f"{order_id}-d{i}" for i in range(4)]
    doomed = [f"doomed-{o}" for o in orders]
    for saga_id in doomed:
        sabotage.always(saga_id)
    async with As(role_settings, deployment.user("agent")) as (bus, _):
        for order, saga_id in zip(orders, doomed, strict=True):
            await publish_start(bus, order, saga_id)
    letters = await eventually(
        lambda: pool.fetch("SELECT id, order_id FROM dead_letters WHERE order_id = ANY($1) "
                           "AND status = 'dead' ORDER BY order_id", orders),
        lambda rows: len(rows) == 4, seconds=60,
    )  # fmt: skip
    ids = [r["id"] for r in letters]
    for saga_id in doomed:
        sabotage.stop(saga_id)

    for verb in ("replay", "discard"):
        assert "403: " in await desk["viewer"].letter(ids[0], verb)
    assert "republished" in await desk["operator"].letter(ids[0], "replay")
    assert "discarded" in await desk["operator"].letter(ids[1], "discard")
    assert "republished" in await desk["person"].letter(ids[2], "replay")
    assert "discarded" in await desk["person"].letter(ids[3], "discard")
    statuses = await pool.fetch("SELECT id, status FROM dead_letters WHERE id = ANY($1)", ids)
    assert {r["id"]: r["status"] for r in statuses} == {
        ids[0]: "replayed",
        ids[1]: "discarded",
        ids[2]: "replayed",
        ids[3]: "discarded",
    }
    actors = await pool.fetch("SELECT dead_letter_id, actor FROM dlq_audit "
                              "WHERE dead_letter_id = ANY($1) ORDER BY id", ids)  # fmt: skip
    assert [(r["dead_letter_id"], r["actor"]) for r in actors] == [
        (ids[0], names["operator"]), (ids[1], names["operator"]),
        (ids[2], names["person"]), (ids[3], names["person"]),
    ]  # fmt: skip
    for saga_id in (doomed[0], doomed[2]):
        assert (await terminal(stack, saga_id)).status == "completed"
