"""The ``payments`` actions served by calling the HTTP payments API with httpx
(``saga run payments-http``): the pattern for putting a real external API behind the catalog.

The saga's idempotency key travels as the ``Idempotency-Key`` header, so a retried or
redelivered call is answered with the first response instead of charging twice. A 5xx, a 429,
a timeout or a dropped connection is ``Transient`` (retried; it may have landed unless the
connection was refused); any other 4xx is ``Permanent``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx

from saga_services.errors import Permanent, Transient
from saga_services.payments.system import CHARGE, REFUND, Charge, Refund
from saga_services.sdk import Call, KeyQuery, KeyStatus, Resources, Result, Service


@contextlib.asynccontextmanager
async def _client(resources: Resources) -> AsyncIterator[httpx.AsyncClient]:
    url = resources.settings.payments_api_url
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=32)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=10.0) as client:
        yield client


async def status(query: KeyQuery, client: httpx.AsyncClient) -> KeyStatus:
    """The API's own key record decides (``POST /v1/settle``): a key no request used is fenced
    there, so a call still on its way is refused (409) rather than landing after the answer."""
    try:
        response = await client.post("/v1/settle", json={"key": query.key})
        answer = response.json() if response.status_code == 200 else None
    except (httpx.TransportError, ValueError):
        return KeyStatus("unknown", reason="the payments API did not answer the settle")
    if not isinstance(answer, dict) or answer.get("state") not in ("fenced", "stored"):
        return KeyStatus("unknown", reason=f"the payments API answered {response.status_code}")
    if answer["state"] == "fenced":
        return KeyStatus("fenced", reason="the payments API fenced the key: it never ran")
    code, body = answer.get("status"), answer.get("body")
    if code == 200 and isinstance(body, dict) and query.action == CHARGE:
        result = {"payment_id": body.get("id"), "amount_cents": body.get("amount_cents"),
                  "card_token": body.get("card_token")}  # fmt: skip
        return KeyStatus("done", result=result)
    if isinstance(code, int) and 400 <= code < 500:
        return KeyStatus("failed", reason=f"the payments API refused it (HTTP {code})")
    return KeyStatus("unknown", reason=f"the payments API stored HTTP {code} for it")


SERVICE = Service("payments", setup=_client, status=status)


@SERVICE.action(CHARGE)
async def charge_card(call: Call[Charge, httpx.AsyncClient]) -> Result:
    p = call.params
    body = {"amount_cents": p.amount_cents, "card_token": p.card_token, "order_id": call.order_id}
    charge = await post(call, "/v1/charges", body)
    return {"payment_id": charge["id"], "amount_cents": p.amount_cents, "card_token": p.card_token}


@SERVICE.compensation(REFUND)
async def refund_charge(call: Call[Refund, httpx.AsyncClient]) -> Result:
    target = call.params.target("payment_id")
    by_id = "payment_id" in target
    body = {"charge": target["payment_id"]} if by_id else {"charge_key": call.params.forward_key}
    refund = await post(call, "/v1/refunds", body)
    return {
        "refund_id": refund["id"], "payment_id": refund["charge"], "refunded": refund["refunded"],
    }  # fmt: skip


Client = Call[Any, httpx.AsyncClient]


async def post(call: Client, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """POST with the call's idempotency key; the JSON answer, or the error it stands for."""
    headers = {"Idempotency-Key": call.key}
    try:
        response = await call.deps.post(path, json=body, headers=headers, timeout=call.remaining_s)
    except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
        # Never reached the server: nothing can have landed.
        reason = f"{call.action}: cannot reach the payments API ({exc!r})"
        raise Transient(reason, may_have_landed=False) from None
    except httpx.TransportError as exc:  # a timeout or a connection lost mid-call
        raise Transient(f"{call.action}: no answer from the payments API ({exc!r})") from None
    status = response.status_code
    if status >= 500 or status == 429:
        raise Transient(f"{call.action}: the payments API answered {status}: {_message(response)}")
    if status >= 400:
        raise Permanent(f"{call.action}: {_message(response)} (HTTP {status})")
    try:
        answer = response.json()
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        raise Permanent(f"{call.action}: HTTP {status} without a JSON object", may_have_landed=True)
    return answer


def _message(response: httpx.Response) -> str:
    try:
        error = response.json()["error"]
        return str(error["message"])
    except (ValueError, KeyError, TypeError):
        return response.text[:200] or response.reason_phrase
