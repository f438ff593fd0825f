"""The console in a real browser (headless Chromium driven by Playwright): what an operator
does with it, end to end, against the stack on the real RabbitMQ and Postgres."""

from __future__ import annotations

import asyncpg
from playwright.async_api import Page, expect

from saga_app.stack import Stack
from saga_services.faults import add_fault, clear_faults
from saga_shared.client import SagaClient
from saga_shared.transport.bus import Bus
from tests.integration.browser import shot, sign_in
from tests.integration.helpers import REFUND, eventually, publish_start, terminal
from tests.integration.sabotage import Sabotage
from tests.integration.test_gates_and_abort import CHECKOUT


async def test_an_operator_finds_a_saga_that_needs_a_person_and_resumes_it(
    console_stack: tuple[Stack, str], page: Page, agent: SagaClient, pool: asyncpg.Pool,
    order_id: str,
) -> None:  # fmt: skip
    stack, base = console_stack
    await add_fault(pool, "email.send_customer_email", order_id, "permanent")
    await add_fault(pool, "erp.void_credit_note", order_id, "permanent")
    saga_id = await agent.start("refund", order_id=order_id, params=REFUND)
    assert (await agent.wait(saga_id, seconds=30)).type == "saga.needs_human"

    await sign_in(page, base, "ana")
    await page.locator(".counts a.status.needs_human").click()
    await shot(page, "sagas")
    await page.get_by_role("link", name=saga_id).click()
    await expect(page.locator("h1")).to_contain_text("needs_human")
    await expect(page.locator(".register")).to_contain_text("compensation_failed")
    await shot(page, "saga-needs-human")

    await clear_faults(pool, order_id)  # the ERP is back
    await page.get_by_label("resume note").fill("ERP back up")
    await page.get_by_role("button", name="Resume").click()
    await expect(page.locator(".flash")).to_contain_text("accepted by the coordinator")
    state = await terminal(stack, saga_id)
    assert state.status == "compensated"
    await page.reload()
    await expect(page.locator("h1")).to_contain_text("compensated")
    await expect(page.locator(".report")).to_contain_text("resume by ana (person via")


async def test_an_operator_approves_a_gated_checkout_from_the_peoples_queue(
    console_stack: tuple[Stack, str], page: Page, agent: SagaClient, order_id: str
) -> None:
    stack, base = console_stack
    saga_id = await agent.start("checkout_approved", order_id=order_id, params=CHECKOUT)
    assert (await agent.wait(saga_id, seconds=30, stops=True)).type == "saga.awaiting_approval"

    await sign_in(page, base, "ana")
    await page.get_by_role("link", name="People's queue").click()
    row = page.locator(f"tr[data-saga='{saga_id}']")
    await expect(row).to_contain_text("next: email.send_confirmation")
    await shot(page, "people")
    await row.get_by_role("link", name="open").click()
    await expect(page.locator("section.card")).to_contain_text("Cannot be undone")
    await shot(page, "saga-awaiting-approval")
    await page.get_by_label("approve note").fill("address checked")
    await page.get_by_role("button", name="Approve").click()
    await expect(page.locator(".flash")).to_contain_text("accepted")
    assert (await terminal(stack, saga_id)).status == "completed"
    await page.reload()
    await expect(page.locator(".report")).to_contain_text("approve by ana")


async def test_replaying_a_dead_letter_unblocks_its_order(
    console_stack: tuple[Stack, str], page: Page, sabotage: Sabotage, order_id: str
) -> None:
    stack, base = console_stack
    doomed = f"doomed-{order_id}"  # saga IDs are one namespace for the whole test database
    sabotage.always(doomed)
    async with Bus(stack.settings) as bus:
        await publish_start(bus, order_id, doomed)
        behind = await publish_start(bus, order_id)
    await eventually(lambda: stack.store.parked(order_id), lambda rows: len(rows) == 1)

    await sign_in(page, base, "ana")
    await page.get_by_role("link", name="Dead letters").click()
    await expect(page.locator("#blocked")).to_contain_text(order_id)
    await shot(page, "dead-letters")
    await page.locator("#blocked").get_by_role("link", name=order_id).click()
    letter = page.locator("#letters tr[data-dead-letter]")
    await expect(letter).to_contain_text("delivery_limit")
    await letter.get_by_role("link").first.click()
    await expect(page.locator("pre.body").first).to_contain_text(doomed)
    await expect(page.locator("body")).to_contain_text("Parked behind it (1)")
    await shot(page, "dead-letter")

    sabotage.stop(doomed)  # the bug is fixed
    await page.get_by_role("button", name="Replay").click()
    await expect(page.locator(".flash")).to_contain_text("republished")
    for saga_id in (doomed, behind):
        assert (await terminal(stack, saga_id)).status == "completed"
    await page.get_by_role("link", name="Dead letters").click()
    await expect(page.locator("#blocked")).not_to_contain_text(order_id)


async def test_a_viewer_sees_but_is_refused_any_action(
    console_stack: tuple[Stack, str], page: Page, agent: SagaClient, order_id: str
) -> None:
    stack, base = console_stack
    saga_id = await agent.start("checkout_approved", order_id=order_id, params=CHECKOUT)
    assert (await agent.wait(saga_id, seconds=30, stops=True)).type == "saga.awaiting_approval"

    await sign_in(page, base, "vic", f"/sagas/{saga_id}")
    await expect(page.locator("h1")).to_contain_text("awaiting_approval")
    await expect(page.get_by_role("button", name="Approve")).to_have_count(0)
    await expect(page.locator("main")).to_contain_text("may look, not decide")
    # A form made by hand, with this session's own token: the role still decides.
    status = await page.evaluate(
        """async (id) => {
            const csrf = document.querySelector("input[name=csrf]").value;
            const body = new URLSearchParams({csrf, text: "I approve"});
            const r = await fetch(`/sagas/${id}/approve`, {method: "POST", body});
            return [r.status, await r.text()];
        }""",
        saga_id,
    )
    assert status[0] == 403 and "may look, not act" in status[1]
    state = await stack.store.get(saga_id)
    assert state is not None and state.status == "awaiting_approval" and state.decisions == ()


async def test_the_list_updates_live_without_a_reload(
    console_stack: tuple[Stack, str], page: Page, agent: SagaClient, order_id: str
) -> None:
    _, base = console_stack
    await sign_in(page, base, "vic")
    live = page.locator("#live")
    await expect(live).to_have_attribute("data-connected", "yes")
    await page.evaluate("window.__sameDocument = true")
    saga_id = await agent.start("refund", order_id=order_id, params=REFUND)
    row = page.locator(f"tr[data-saga='{saga_id}']")
    await expect(row).to_contain_text("completed", timeout=15_000)
    assert await page.evaluate("window.__sameDocument === true")  # no reload happened
