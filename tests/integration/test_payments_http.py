"""The HTTP payments API and the adapter that calls it with httpx, against the real server:
Stripe-like idempotency, the mapping of HTTP answers to Transient / Permanent, a server killed
in the middle of a call, and a checkout saga whose charge and refund go over HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import pytest
from pydantic import JsonValue

from saga_app.stack import Stack
from saga_services.adapter import Adapter
from saga_services.payments.system import CHARGE, REFUND
from saga_shared.client import SagaClient
from saga_shared.config import Settings
from saga_shared.model.catalog import Catalog
from saga_shared.model.messages import ActionDone, ActionFailed, ActionRequest
from saga_shared.transport.bus import Bus
from tests.integration.helpers import eventually, remove_namespace, saga_env
from tests.integration.test_sagas import CHECKOUT
from tests.ports import free_port


@pytest.fixture
def http_settings(settings: Settings) -> Settings:
    port = free_port()
    return settings.with_(
        payments_api_bind=f"127.0.0.1:{port}", payments_api_url=f"http://127.0.0.1:{port}"
    )


@pytest.fixture
async def api(http_settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """The payments API served in this process, and a client for it."""
    async with (
        Stack(http_settings, ["payments-api"]),
        httpx.AsyncClient(base_url=http_settings.payments_api_url, timeout=10) as client,
    ):
        yield client


@pytest.fixture
async def adapter(
    http_settings: Settings, catalog: Catalog, pool: asyncpg.Pool
) -> AsyncIterator[Adapter]:
    """The payments-http adapter (perform() needs no broker)."""
    made = Adapter("payments-http", http_settings, catalog, Bus(http_settings), pool)
    await made.open()
    yield made
    await made.aclose()


def charge(order_id: str, token: str = "tok_visa", attempt: int = 1) -> ActionRequest:
    return ActionRequest(
        saga_id=f"saga-{order_id}", order_id=order_id, action=CHARGE, phase="forward", step=1,
        idempotency_key=f"saga-{order_id}:{CHARGE}", attempt=attempt, timeout_s=10,
        params={"amount_cents": 1200, "card_token": token},
    )  # fmt: skip


def refund(order_id: str, **params: JsonValue) -> ActionRequest:
    return ActionRequest(
        saga_id=f"saga-{order_id}", order_id=order_id, action=REFUND, phase="compensation",
        step=1, idempotency_key=f"saga-{order_id}:{REFUND}", timeout_s=10,
        params={"forward_key": f"saga-{order_id}:{CHARGE}", **params},
    )  # fmt: skip


async def charges(pool: asyncpg.Pool, order_id: str) -> list[dict[str, Any]]:
    rows = await pool.fetch("SELECT * FROM payapi_charges WHERE order_id = $1", order_id)
    return [dict(r) for r in rows]


# --- the API's own promises ----------------------------------------------------------------------


async def test_the_first_answer_per_key_is_stored_and_replayed(
    api: httpx.AsyncClient, pool: asyncpg.Pool, order_id: str
) -> None:
    body = {"amount_cents": 500, "card_token": "tok_visa", "order_id": order_id}
    key = {"Idempotency-Key": f"k-{order_id}"}
    first = await api.post("/v1/charges", json=body, headers=key)
    again = await api.post("/v1/charges", json=body, headers=key)
    other = await api.post("/v1/charges", json={**body, "amount_cents": 9}, headers=key)

    assert first.status_code == 200 and first.json()["id"].startswith("ch_")
    assert again.json() == first.json()
    assert again.headers["Idempotent-Replayed"] == "true"
    assert other.status_code == 422
    assert other.json()["error"]["type"] == "idempotency_error"
    assert len(await charges(pool, order_id)) == 1


async def test_refusals_are_stored_server_errors_and_bad_requests_are_not(
    api: httpx.AsyncClient, pool: asyncpg.Pool, order_id: str
) -> None:
    body = {"amount_cents": 500, "card_token": "tok_declined_x", "order_id": order_id}
    declined = await api.post("/v1/charges", json=body, headers={"Idempotency-Key": order_id})
    replayed = await api.post("/v1/charges", json=body, headers={"Idempotency-Key": order_id})
    broken = {**body, "card_token": "tok_error"}
    failing = [
        (await api.post("/v1/charges", json=broken, headers={"Idempotency-Key": "e" + order_id}))
        for _ in range(2)
    ]
    no_key = await api.post("/v1/charges", json=body)
    too_big = await api.post(
        "/v1/charges", json={**body, "amount_cents": 10**13}, headers={"Idempotency-Key": "b"}
    )

    assert declined.status_code == replayed.status_code == 402
    assert replayed.headers["Idempotent-Replayed"] == "true"
    assert [r.status_code for r in failing] == [500, 500]
    assert "Idempotent-Replayed" not in failing[1].headers
    assert no_key.status_code == 400 and "Idempotency-Key" in no_key.json()["error"]["message"]
    assert too_big.status_code == 400 and "amount_cents" in too_big.json()["error"]["message"]
    assert await pool.fetchval("SELECT count(*) FROM payapi_requests WHERE key = 'b'") == 0
    assert await charges(pool, order_id) == []


# --- the adapter variant -------------------------------------------------------------------------


async def test_charge_and_refund_over_http_each_once(
    api: httpx.AsyncClient, adapter: Adapter, pool: asyncpg.Pool, order_id: str
) -> None:
    done = await adapter.perform(charge(order_id))
    redelivered = await adapter.perform(charge(order_id, attempt=2))
    assert isinstance(done, ActionDone) and isinstance(redelivered, ActionDone)
    payment_id = done.result["payment_id"]
    undone = await adapter.perform(refund(order_id, payment_id=payment_id))

    assert redelivered.result == done.result
    assert isinstance(undone, ActionDone)
    assert undone.result["payment_id"] == payment_id and undone.result["refunded"] is True
    [row] = await charges(pool, order_id)
    assert row["id"] == payment_id and row["refund_id"] == undone.result["refund_id"]


async def test_http_answers_map_to_permanent_and_transient(
    api: httpx.AsyncClient, adapter: Adapter, order_id: str
) -> None:
    declined = await adapter.perform(charge(order_id, "tok_declined"))
    erroring = await adapter.perform(charge(f"{order_id}-5xx", "tok_error"))

    assert isinstance(declined, ActionFailed)
    assert (declined.effect_unknown, declined.tries) == (False, 1)
    assert "declined" in declined.reason and "HTTP 402" in declined.reason
    assert isinstance(erroring, ActionFailed)
    assert (erroring.effect_unknown, erroring.tries) == (True, 4)  # a 5xx may have landed
    assert "answered 500" in erroring.reason


async def test_an_unreachable_api_never_landed(adapter: Adapter, order_id: str) -> None:
    # No server on the port: every try is refused before it reaches anything.
    outcome = await adapter.perform(charge(order_id))

    assert isinstance(outcome, ActionFailed)
    assert (outcome.effect_unknown, outcome.tries) == (False, 4)
    assert "cannot reach the payments API" in outcome.reason


@contextlib.asynccontextmanager
async def api_process(settings: Settings) -> AsyncIterator[asyncio.subprocess.Process]:
    """`saga run payments-api` as its own process, ready when it answers /healthz."""
    env = {**saga_env(settings), "SAGA_PAYMENTS_API_BIND": settings.payments_api_bind}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "saga_app.cli", "run", "payments-api", env=env,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        async with httpx.AsyncClient(base_url=settings.payments_api_url) as client:
            for _ in range(200):
                with contextlib.suppress(httpx.TransportError):
                    if (await client.get("/healthz")).status_code == 200:
                        break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("the payments API did not start")
        yield proc
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(proc.wait(), 30)


async def test_a_server_killed_mid_call_charges_at_most_once(
    http_settings: Settings, adapter: Adapter, pool: asyncpg.Pool, order_id: str
) -> None:
    slow = charge(order_id, "tok_slow_3000")  # the server holds its transaction for 3 s
    async with api_process(http_settings) as server:
        call = asyncio.create_task(adapter.perform(slow))
        await asyncio.sleep(0.8)
        os.kill(server.pid, signal.SIGKILL)  # in the middle of the call, before its commit
        await server.wait()
        lost = await call
    # The first try may have landed, the retries could not reach the server: unknown effect.
    assert isinstance(lost, ActionFailed) and lost.effect_unknown is True
    assert await charges(pool, order_id) == []
    async with api_process(http_settings):
        # The coordinator undoes an unknown effect by the forward key: nothing was charged,
        # so the key is fenced, and a late retry of the charge cannot land any more.
        undone = await adapter.perform(refund(order_id))
        late = await adapter.perform(charge(order_id, "tok_slow_3000", attempt=2))

    assert isinstance(undone, ActionDone) and undone.result["refunded"] is False
    # The API's own record (its settle route, the service's status hook) said the charge never
    # ran and fenced it there: the register learns it did not happen.
    assert undone.forward == "fenced"
    # The late retry is refused by the service's key record before any HTTP call is made.
    assert isinstance(late, ActionFailed) and late.effect_unknown is False
    assert late.reason.startswith("fenced, nothing done")
    assert await charges(pool, order_id) == []


async def test_a_checkout_charges_and_refunds_over_http(
    http_settings: Settings, pool: asyncpg.Pool, order_id: str
) -> None:
    parts = ["coordinator", "inventory", "erp", "email", "payments-http", "payments-api"]
    closed = {**CHECKOUT, "address": "7 Closed Depot Road"}  # the step after the charge fails
    try:
        async with Stack(http_settings, parts) as stack, Bus(http_settings) as bus:
            async with SagaClient(bus, answer_within_s=20) as agent:
                ok = await agent.start("checkout", order_id=order_id, params=CHECKOUT)
                undone = await agent.start("checkout", order_id=f"{order_id}-2", params=closed)
                assert (await agent.wait(ok, seconds=30)).status == "completed"
                assert (await agent.wait(undone, seconds=30)).status == "compensated"
            state = await stack.store.get(undone)
    finally:
        await remove_namespace(http_settings)

    assert state is not None
    [paid] = await charges(pool, order_id)
    [refunded] = await charges(pool, f"{order_id}-2")
    assert paid["refund_id"] is None
    assert refunded["refund_id"] is not None
    assert refunded["id"] == state.steps[1].result["payment_id"]  # type: ignore[index]


async def test_bad_bodies_are_refused_with_a_reason_and_store_nothing(
    api: httpx.AsyncClient, pool: asyncpg.Pool, order_id: str
) -> None:
    key = {"Idempotency-Key": f"bad-{order_id}", "Content-Type": "application/json"}
    nested = b'{"amount_cents": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    answers = {
        "huge": await api.post("/v1/charges", content=b"x" * 200_000, headers=key),
        "not json": await api.post("/v1/charges", content=b"{nope", headers=key),
        "nested": await api.post("/v1/charges", content=nested, headers=key),
        "a bool for an int": await api.post(
            "/v1/charges", headers=key,
            json={"amount_cents": True, "card_token": "tok_visa", "order_id": order_id},
        ),
        "a control character": await api.post(
            "/v1/charges", headers=key,
            json={"amount_cents": 5, "card_token": "tok\x1b[2J", "order_id": order_id},
        ),
        "a control key": await api.post(
            "/v1/charges", headers={"Idempotency-Key": "k\x07"},
            json={"amount_cents": 5, "card_token": "tok_visa", "order_id": order_id},
        ),
    }  # fmt: skip

    statuses = {what: r.status_code for what, r in answers.items()}
    assert statuses == {
        "huge": 413, "not json": 400, "nested": 400, "a bool for an int": 400,
        "a control character": 400, "a control key": 400,
    }  # fmt: skip
    assert all(r.json()["error"]["message"] for r in answers.values())
    stored = await pool.fetchval(
        "SELECT count(*) FROM payapi_requests WHERE key = $1", key["Idempotency-Key"]
    )
    assert stored == 0
    assert await charges(pool, order_id) == []


async def test_a_send_whose_key_another_process_is_calling_is_left_to_that_call(
    http_settings: Settings, api: httpx.AsyncClient, adapter: Adapter, catalog: Catalog,
    pool: asyncpg.Pool, order_id: str,
) -> None:  # fmt: skip
    """Two adapter processes: one is charging (the server takes 3 s) when a later send of the
    charge (a resend) reaches the other. It calls nothing and reports nothing, neither a
    failure nor doubt: the first one's answer is the answer."""
    other = Adapter("payments-http", http_settings, catalog, Bus(http_settings), pool,
                    owner="other@test")  # fmt: skip
    await other.open()
    try:
        call = asyncio.create_task(adapter.perform(charge(order_id, "tok_slow_3000")))
        owner = "SELECT owner FROM service_keys WHERE key = $1"
        await eventually(lambda: pool.fetchval(owner, f"saga-{order_id}:{CHARGE}"),
                         lambda found: found is not None)  # fmt: skip
        again = await other.perform(charge(order_id, "tok_slow_3000", attempt=2))
        answer = await call
    finally:
        await other.aclose()

    assert again is None
    assert isinstance(answer, ActionDone)
    assert len(await charges(pool, order_id)) == 1
