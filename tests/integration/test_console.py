"""The console over HTTP: who may see and do what, forms that did not come from it, and what a
careless or hostile visitor types. Its operations are the CLI's commands, for the person."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from saga_app.stack import Stack
from saga_shared.client import SagaClient
from tests.integration.console_kit import accounts_file, console_http, sign_in, token
from tests.integration.helpers import eventually, publish_start, terminal
from tests.integration.sabotage import Sabotage
from tests.integration.test_gates_and_abort import CHECKOUT

PAGES = [
    "/sagas",
    "/sagas/x",
    "/sagas/x/report.md",
    "/people",
    "/dead-letters",
    "/dead-letters/1",
    "/rejections",
    "/catalog",
]


@pytest.fixture
async def http(stack: Stack, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with console_http(stack, accounts_file(tmp_path)) as client:
        yield client


async def gated(client: SagaClient, order_id: str) -> str:
    saga_id = await client.start("checkout_approved", order_id=order_id, params=CHECKOUT)
    assert (await client.wait(saga_id, seconds=30, stops=True)).type == "saga.awaiting_approval"
    return saga_id


async def status(stack: Stack, saga_id: str) -> str | None:
    state = await stack.store.get(saga_id)
    return None if state is None else state.status


async def test_every_page_and_form_needs_a_signed_in_account(http: httpx.AsyncClient) -> None:
    for path in PAGES:
        answer = await http.get(path)
        assert answer.status_code == 303, path
        assert answer.headers["location"].startswith("/login?next=")
    assert (await http.get("/events")).status_code == 401
    assert (await http.get("/sagas?fragment=1")).status_code == 401
    posted = await http.post("/sagas/x/approve", data={"text": "", "csrf": "x"})
    assert posted.headers["location"].startswith("/login")


async def test_a_wrong_password_and_an_unknown_name_look_the_same(http: httpx.AsyncClient) -> None:
    wrong = await sign_in(http, "ana", "not-her-password")
    unknown = await sign_in(http, "nobody", "whatever")
    assert wrong.status_code == unknown.status_code == 401
    assert "do not match an account" in wrong.text and "do not match an account" in unknown.text
    assert (await http.get("/sagas")).status_code == 303  # still signed out


async def test_guessing_passwords_is_slowed_down(http: httpx.AsyncClient) -> None:
    codes = [(await sign_in(http, "ana", f"guess-{i}")).status_code for i in range(12)]
    assert codes[0] == 401 and codes[-1] == 429
    assert (await sign_in(http, "ana")).status_code == 429  # even the right one, for now


async def test_after_sign_in_only_a_page_of_the_console_is_a_destination(
    http: httpx.AsyncClient,
) -> None:
    for target, expected in [
        ("//evil.example/x", "/sagas"),
        ("https://evil.example", "/sagas"),
        ("/\\evil.example", "/sagas"),
        ("/people", "/people"),
    ]:
        http.cookies.clear()  # a new visitor
        form = {
            "name": "ana",
            "password": "ana-long-password",
            "next": target,
            "csrf": await token(http),
        }
        answer = await http.post("/login", data=form)
        assert answer.headers["location"] == expected, target


async def test_an_operator_approves_and_the_register_names_the_person_not_a_form_field(
    stack: Stack, http: httpx.AsyncClient, client: SagaClient, order_id: str
) -> None:
    saga_id = await gated(client, order_id)
    await sign_in(http, "ana")
    page = await http.get(f"/sagas/{saga_id}")
    assert "awaiting_approval" in page.text and f"/sagas/{saga_id}/approve" in page.text
    form = {
        "text": "address checked",
        "by": "mallory",
        "actor": "mallory",
        "csrf": await token(http, f"/sagas/{saga_id}"),
    }
    answer = await http.post(f"/sagas/{saga_id}/approve", data=form)
    assert answer.headers["location"] == f"/sagas/{saga_id}"
    assert "accepted by the coordinator" in (await http.get(f"/sagas/{saga_id}")).text
    state = await terminal(stack, saga_id)
    assert state.status == "completed"
    [decision] = state.decisions
    assert (decision.kind, decision.by, decision.note) == ("approve", "ana", "address checked")
    assert decision.role == f"person via {stack.directory.user('console')}"


async def test_a_viewer_is_refused_and_nothing_is_sent(
    stack: Stack, http: httpx.AsyncClient, client: SagaClient, order_id: str
) -> None:
    saga_id = await gated(client, order_id)
    await sign_in(http, "vic")
    page = await http.get(f"/sagas/{saga_id}")
    assert f"/sagas/{saga_id}/approve" not in page.text  # no buttons for a viewer
    form = {"text": "", "csrf": await token(http, "/sagas")}
    answer = await http.post(f"/sagas/{saga_id}/approve", data=form)
    assert answer.status_code == 403 and "may look, not act" in answer.text
    await asyncio.sleep(1.0)  # had anything been sent, the saga would have moved by now
    assert await status(stack, saga_id) == "awaiting_approval"
    assert (await stack.store.get(saga_id)).decisions == ()  # type: ignore[union-attr]


async def test_forms_from_elsewhere_are_refused(
    stack: Stack, http: httpx.AsyncClient, client: SagaClient, order_id: str, tmp_path: Path
) -> None:
    saga_id = await gated(client, order_id)
    await sign_in(http, "ana")
    url = f"/sagas/{saga_id}/approve"
    no_token = await http.post(url, data={"text": "x"})
    other = await http.post(url, data={"text": "x", "csrf": "A" * 43})
    own = await token(http, "/sagas")
    cross_site = await http.post(
        url, data={"text": "x", "csrf": own}, headers={"origin": "https://evil.example"}
    )
    assert [r.status_code for r in (no_token, other, cross_site)] == [403, 403, 403]
    assert "another site" in cross_site.text
    await asyncio.sleep(1.0)
    assert await status(stack, saga_id) == "awaiting_approval"


async def test_a_destructive_action_is_confirmed_first(
    stack: Stack, http: httpx.AsyncClient, client: SagaClient, order_id: str
) -> None:
    saga_id = await gated(client, order_id)
    await sign_in(http, "ana")
    form = {"text": "the customer called", "csrf": await token(http, "/sagas")}
    asked = await http.post(f"/sagas/{saga_id}/reject", data=form)
    assert asked.status_code == 200 and f"Reject saga {saga_id}?" in asked.text
    assert await status(stack, saga_id) == "awaiting_approval"
    blank = await http.post(f"/sagas/{saga_id}/reject", data={**form, "text": " "})
    assert "needs a reason" in (await http.get(blank.headers["location"])).text
    await http.post(f"/sagas/{saga_id}/reject", data={**form, "confirmed": "yes"})
    assert (await terminal(stack, saga_id)).status == "compensated"


async def test_hostile_values_get_a_clear_answer_and_are_never_run(
    http: httpx.AsyncClient, client: SagaClient, stack: Stack, order_id: str
) -> None:
    await sign_in(http, "ana")
    for query, said in [
        ("status=<script>alert(1)</script>", "status: letters"),
        ("status=paused", "status: one of"),
        ("order=a%00b", "order: letters"),
        ("since=" + "9" * 5000, "since:"),
        ("after=garbage", "after: not a page"),
        ("until=1e999d", "until:"),
    ]:
        answer = await http.get(f"/sagas?{query}")
        assert answer.status_code == 400 and said in answer.text, query
        assert "<script>alert" not in answer.text
    assert (await http.get("/sagas/%00%01")).status_code == 404
    assert (await http.get("/dead-letters/" + "9" * 40)).status_code == 404
    assert (await http.get("/dead-letters/-1")).status_code == 404
    saga_id = await gated(client, order_id)
    form = {"text": "x" * 5_000, "csrf": await token(http, "/sagas")}
    answer = await http.post(f"/sagas/{saga_id}/approve", data=form)
    assert "at most 2000" in (await http.get(answer.headers["location"])).text
    huge = await http.post(
        f"/sagas/{saga_id}/approve",
        content=b"a=" + b"x" * 100_000,
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    assert huge.status_code == 403
    csrf = await token(http, "/sagas")
    stale = {"order": order_id, "reason": "r", "confirmed": "yes", "expected": "x" * 16}
    for fields, said in [  # a bulk abort: hostile filters, a forged confirmation, no reason
        ({"order": "a\x00b", "reason": "r"}, "order: letters"),
        ({"since": "9" * 5000, "reason": "r"}, "since:"),
        ({"order": order_id, "reason": ""}, "abort needs a reason"),
        ({**stale, "batch": "0" * 16}, "changed since you confirmed"),
    ]:
        answer = await http.post("/sagas/abort-all", data={**fields, "csrf": csrf})
        assert answer.status_code == 303, fields
        shown = (await http.get(answer.headers["location"])).text
        assert said in shown and "<script>x" not in shown, (fields, said)
    asked = await http.post("/sagas/abort-all", data={"order": order_id, "reason": "r",
                                                      "csrf": csrf})  # fmt: skip
    assert "Abort 1 saga(s)?" in asked.text  # asked first: nothing sent yet
    expected = re.search(r'name="expected" value="([0-9a-f]{16})"', asked.text)
    assert expected is not None
    forged = {"order": order_id, "reason": "r", "confirmed": "yes", "csrf": csrf,
              "expected": expected.group(1), "batch": "<script>x"}  # fmt: skip
    answer = await http.post("/sagas/abort-all", data=forged)
    shown = (await http.get(answer.headers["location"])).text
    assert "not a confirmation of this console" in shown and "<script>x" not in shown
    assert await status(stack, saga_id) == "awaiting_approval"


async def test_the_incident_report_downloads_as_markdown(
    stack: Stack, http: httpx.AsyncClient, client: SagaClient, order_id: str
) -> None:
    saga_id = await gated(client, order_id)
    await sign_in(http, "vic")
    answer = await http.get(f"/sagas/{saga_id}/report.md")
    assert answer.headers["content-type"].startswith("text/markdown")
    assert f'filename="saga-{saga_id}.md"' in answer.headers["content-disposition"]
    assert answer.text.startswith(f"# Saga {saga_id} (checkout_approved), order {order_id}")


async def test_pages_list_what_the_database_holds(
    stack: Stack, http: httpx.AsyncClient, client: SagaClient, order_id: str
) -> None:
    saga_id = await gated(client, order_id)
    await sign_in(http, "vic")
    listed = await http.get("/sagas?status=awaiting_approval")
    assert saga_id in listed.text
    assert saga_id not in (await http.get("/sagas?status=completed")).text
    assert saga_id in (await http.get(f"/sagas?order={order_id}&since=1h")).text
    people = await http.get("/people")
    assert saga_id in people.text and "next: email.send_confirmation" in people.text
    catalog = await http.get("/catalog")
    assert "checkout_approved" in catalog.text and "payments.charge_card" in catalog.text
    answer = await http.get("/sagas")
    for name in ("content-security-policy", "x-frame-options", "x-content-type-options"):
        assert name in answer.headers
    await eventually(lambda: http.get("/people?fragment=1"), lambda r: saga_id in r.text)


async def test_a_reason_group_is_replayed_after_confirmation(
    stack: Stack, http: httpx.AsyncClient, client: SagaClient, sabotage: Sabotage, order_id: str
) -> None:
    saga_id = f"group-{order_id}"
    sabotage.always(saga_id)
    await publish_start(client.bus, order_id, saga_id)
    await eventually(lambda: stack.store.blocks(order_id), lambda rows: len(rows) == 1)
    sabotage.stop(saga_id)
    await sign_in(http, "ana")
    form = {"reason": "delivery_limit", "csrf": await token(http, "/dead-letters")}
    asked = await http.post("/dead-letters/replay", data=form)
    how_many = await stack.pool.fetchval(
        "SELECT count(*) FROM dead_letters WHERE status = 'dead' AND reason = 'delivery_limit'"
    )
    assert f"Replay {how_many} dead letter(s) of reason delivery_limit?" in asked.text
    expected = re.search(r'name="expected" value="([0-9a-f]{16})"', asked.text)
    assert expected is not None, "the confirmation carries what was confirmed"
    bad = await http.post(
        "/dead-letters/replay", data={**form, "reason": "x\x00y", "confirmed": "yes"}
    )
    assert "not a replay this console can send" in (await http.get(bad.headers["location"])).text
    stale = await http.post(
        "/dead-letters/replay", data={**form, "confirmed": "yes", "expected": "0" * 16}
    )
    assert "changed since you confirmed" in (await http.get(stale.headers["location"])).text
    assert await stack.store.blocks(order_id) != [], "nothing replayed on a stale confirmation"
    confirmed = {**form, "confirmed": "yes", "expected": expected.group(1)}
    await http.post("/dead-letters/replay", data=confirmed)
    assert (await terminal(stack, saga_id)).status == "completed"
    assert await stack.store.blocks(order_id) == []
