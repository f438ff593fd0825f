"""A small payment API over HTTP, standing for Stripe in the demo (``saga run payments-api``).

    POST /v1/charges   {"amount_cents": 1200, "card_token": "tok_visa", "order_id": "o-1"}
    POST /v1/refunds   {"charge": "ch_..."}  or  {"charge_key": "<the charge's Idempotency-Key>"}
    POST /v1/settle    {"key": "<any Idempotency-Key>"}
    GET  /v1/charges?order_id=o-1
    GET  /healthz

Both POSTs need an ``Idempotency-Key`` header and behave like Stripe's: the first response per
key (success or refusal) is stored in the same transaction as its effect and replayed for every
later request with that key (``Idempotent-Replayed: true``); the same key with other parameters
is refused (422); a 5xx and a request that fails validation are not stored, so a retry runs for
real. A refund by ``charge_key`` finds the charge made with that key, or, when none was made,
fences the key so that a late charge with it is refused (409) instead of landing unnoticed.
A settle does the same for any key: it answers ``{"state": "fenced"}`` when no request used it
(which fences it), or ``{"state": "stored", "status": ..., "body": ...}`` with the response
stored for it; a request still in flight with that key is waited for.

Test cards: ``tok_declined...`` is declined (402); ``tok_error...`` answers 500 every time;
``tok_slow_<ms>...`` holds the transaction that long before it commits (to kill the server
mid-call).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any
from uuid import uuid4

import asyncpg
from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from saga_services.store import Conn, row_dict
from saga_shared import http_server
from saga_shared.storage.sql import Queries
from saga_shared.transport.codec import describe

Q = Queries(Path(__file__).with_name("queries.sql"))
MAX_BODY = 64 * 1024
FENCED = "fenced"  # the fingerprint of a key a refund cancelled before any charge used it
Text = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[\x21-\x7e]+$")]
Answer = tuple[int, dict[str, Any]]


class ChargeBody(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    amount_cents: Annotated[StrictInt, Field(gt=0, le=10**12)]
    card_token: Text
    order_id: Text


class RefundBody(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    charge: Text | None = None
    charge_key: Annotated[str, Field(min_length=1, max_length=255)] | None = None


class SettleBody(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    key: Annotated[str, Field(min_length=1, max_length=255)]


class _NotStored(Exception):
    def __init__(self, status: int, payload: dict[str, Any]) -> None:
        self.status, self.payload = status, payload


def _error(status: int, kind: str, message: str) -> Answer:
    return status, {"error": {"type": kind, "message": message}}


def create_app(pool: asyncpg.Pool) -> Starlette:
    async def charges(request: Request) -> Response:
        return await _idempotent(pool, request, ChargeBody, _charge)

    async def refunds(request: Request) -> Response:
        return await _idempotent(pool, request, RefundBody, _refund)

    async def list_charges(request: Request) -> Response:
        order_id = request.query_params.get("order_id", "")
        if not order_id:
            return JSONResponse(_error(400, "invalid_request_error", "give ?order_id=")[1], 400)
        rows = await pool.fetch(Q.charges_for_order, order_id)
        return JSONResponse({"data": [row_dict(r) for r in rows]})

    async def settle(request: Request) -> Response:
        raw = await _body(request)
        if raw is None:
            return _json(_error(413, "invalid_request_error", f"body over {MAX_BODY} bytes"))
        try:
            body = SettleBody.model_validate_json(raw)
        except ValidationError as exc:
            return _json(_error(400, "invalid_request_error", describe(exc)))
        return JSONResponse(await _settle(pool, body.key))

    async def health(request: Request) -> Response:
        return JSONResponse({"ok": True})

    return Starlette(
        routes=[
            Route("/v1/charges", charges, methods=["POST"]),
            Route("/v1/charges", list_charges, methods=["GET"]),
            Route("/v1/refunds", refunds, methods=["POST"]),
            Route("/v1/settle", settle, methods=["POST"]),
            Route("/healthz", health),
        ]
    )


async def _idempotent(
    pool: asyncpg.Pool,
    request: Request,
    model: type[BaseModel],
    perform: Callable[[Conn, Any, str], Awaitable[Answer]],
) -> Response:
    key = request.headers.get("idempotency-key", "")
    if not 1 <= len(key) <= 255 or not key.isprintable():
        return _json(_error(400, "invalid_request_error", "an Idempotency-Key header is required"))
    raw = await _body(request)
    if raw is None:
        return _json(_error(413, "invalid_request_error", f"body over {MAX_BODY} bytes"))
    try:
        body = model.model_validate_json(raw)
    except ValidationError as exc:
        return _json(_error(400, "invalid_request_error", describe(exc)))
    canonical = json.dumps(body.model_dump(mode="json"), sort_keys=True)
    fingerprint = hashlib.sha256(f"{request.url.path}\n{canonical}".encode()).hexdigest()
    try:
        async with pool.acquire() as conn, conn.transaction():
            if await conn.fetchval(Q.claim, key, fingerprint) is None:
                return _replay(await conn.fetchrow(Q.stored, key), fingerprint)
            status, payload = await perform(conn, body, key)
            if status >= 500:
                raise _NotStored(status, payload)  # rolls back: a retry runs for real
            await conn.execute(Q.answer, key, status, json.dumps(payload))
    except _NotStored as failed:
        return _json((failed.status, failed.payload))
    return _json((status, payload))


async def _settle(pool: asyncpg.Pool, key: str) -> dict[str, Any]:
    """Fence ``key`` if no request used it (waiting for one in flight), else its response."""
    async with pool.acquire() as conn, conn.transaction():
        if await conn.fetchval(Q.claim, key, FENCED) is not None:
            fence = _error(409, "idempotency_error", "cancelled by a settle before it ran")
            await conn.execute(Q.answer, key, fence[0], json.dumps(fence[1]))
            return {"state": "fenced"}
        row = await conn.fetchrow(Q.stored, key)
    assert row is not None  # the claim conflicted, so the row exists
    if row["fingerprint"] == FENCED:
        return {"state": "fenced"}
    return {"state": "stored", "status": row["status"], "body": json.loads(row["body"])}


async def _body(request: Request) -> bytes | None:
    """The body, or None past ``MAX_BODY``: read no further than that, whatever the client
    claims or sends."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY:
        return None
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _replay(row: asyncpg.Record | None, fingerprint: str) -> Response:
    assert row is not None  # the claim conflicted, so the row exists
    if row["fingerprint"] not in (fingerprint, FENCED):
        message = "this Idempotency-Key was used with other parameters"
        return _json(_error(422, "idempotency_error", message))
    return Response(row["body"], row["status"], {"Idempotent-Replayed": "true"}, "application/json")


def _json(answer: Answer) -> Response:
    return JSONResponse(answer[1], answer[0])


async def _charge(conn: Conn, body: ChargeBody, key: str) -> Answer:
    token = body.card_token
    if token.startswith("tok_error"):
        return _error(500, "api_error", "the card network is unavailable")
    if token.startswith("tok_declined"):
        return _error(402, "card_error", f"card {token} was declined")
    charge_id = f"ch_{uuid4().hex}"
    await conn.execute(Q.charge, charge_id, key, body.order_id, body.amount_cents, token)
    if token.startswith("tok_slow_"):
        digits = token.removeprefix("tok_slow_").split("_")[0]
        await asyncio.sleep(min(int(digits or 0), 60_000) / 1000 if digits.isdigit() else 0)
    answer = {"id": charge_id, "object": "charge", "amount_cents": body.amount_cents}
    return 200, {**answer, "card_token": token, "order_id": body.order_id, "status": "succeeded"}


async def _refund(conn: Conn, body: RefundBody, key: str) -> Answer:
    if (body.charge is None) == (body.charge_key is None):
        return _error(400, "invalid_request_error", "give exactly one of charge and charge_key")
    if body.charge is not None:
        charge = await conn.fetchrow(Q.charge_by_id, body.charge)
        if charge is None:
            return _error(404, "resource_missing", f"no charge {body.charge}")
        return 200, await _refunded(conn, charge)
    charge = await conn.fetchrow(Q.charge_by_key, body.charge_key)
    if charge is None:
        # No charge yet: fence the key (this waits for a charge with it still in flight).
        if await conn.fetchval(Q.claim, body.charge_key, FENCED) is not None:
            fence = _error(409, "idempotency_error", "cancelled by a refund before it ran")
            await conn.execute(Q.answer, body.charge_key, fence[0], json.dumps(fence[1]))
        else:  # the key was used: by a charge now committed, or one that was refused
            charge = await conn.fetchrow(Q.charge_by_key, body.charge_key)
    if charge is None:
        return 200, {"id": None, "object": "refund", "charge": None, "refunded": False}
    return 200, await _refunded(conn, charge)


async def _refunded(conn: Conn, charge: asyncpg.Record) -> dict[str, Any]:
    """A charge refunded in full; refunding it again answers with the first refund."""
    refund_id = charge["refund_id"] or f"re_{uuid4().hex}"
    if charge["refund_id"] is None:
        await conn.execute(Q.refund, charge["id"], refund_id)
    return {"id": refund_id, "object": "refund", "charge": charge["id"], "refunded": True,
            "amount_cents": charge["amount_cents"]}  # fmt: skip


def bound_socket(bind: str) -> socket.socket:
    return http_server.bound_socket("SAGA_PAYMENTS_API_BIND", bind)


async def serve(pool: asyncpg.Pool, sock: socket.socket) -> None:
    """Serve the API on ``sock`` until cancelled, then stop gracefully."""
    await http_server.serve(create_app(pool), sock)
