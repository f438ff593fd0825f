"""``saga run console``: the operators' web console (Starlette, Jinja2 templates, one small
script for live updates; served by uvicorn).

Every page needs a signed-in account; every form needs this session's token; an operation
needs the ``operator`` role, and is sent as the CLI would send it, for that person."""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from saga_app.console import operations, pages
from saga_app.console.accounts import Account, Accounts
from saga_app.console.live import Hub
from saga_app.console.reads import ConsoleReads
from saga_app.console.web import (
    CsrfFailed,
    SecurityHeaders,
    check_csrf,
    current,
    render,
    sign_in_redirect,
)
from saga_shared.client import SagaClient
from saga_shared.model.catalog import Catalog
from saga_shared.security.identity import Directory
from saga_shared.security.ratelimit import TokenBuckets
from saga_shared.security.trust import is_person
from saga_shared.transport.bus import QueueDepth

log = logging.getLogger(__name__)
_MAX_FORM_BYTES = 64 * 1024


@dataclass
class Console:
    catalog: Catalog
    reads: ConsoleReads
    accounts: Accounts
    hub: Hub
    client: SagaClient | None
    # Who the coordinator takes for a person (SAGA_PEOPLE): only they are offered what only a
    # person may decide. None: nobody is.
    directory: Directory | None = None
    # A few sign-in attempts a minute per name and per address: scrypt makes each one slow,
    # this makes guessing slower still.
    sign_ins: TokenBuckets = field(default_factory=lambda: TokenBuckets(5 / 60, 10))
    # A process that has not beat for this long is shown as silent (three heartbeats).
    silent_after_s: float = 15.0
    # A dead letter's trace in the team's trace UI: a URL with {trace_id} (SAGA_CONSOLE_TRACE_URL).
    trace_url: str = ""
    _depths: tuple[float, dict[str, QueueDepth | None]] = (0.0, {})

    def is_person(self, name: str) -> bool:
        return self.directory is not None and is_person(self.directory, name)

    async def depths(self) -> dict[str, QueueDepth | None]:
        """The queues' depths, asked of the broker at most every 2 s however many pages
        are open (each ask is a channel per queue)."""
        if self.client is None:
            return {}
        at, known = self._depths
        if time.monotonic() - at > 2.0:
            known = await self.client.bus.depths()
            self._depths = (time.monotonic(), known)
        return known


Page = Callable[[Console, Request, Account], Awaitable[Response]]
Action = Callable[[Console, Request, Account, Any], Awaitable[Response]]


async def _checked_form(request: Request, account: Account | None) -> Any:
    """The form, if it is small and carries this session's token from this console's origin;
    otherwise the page that refuses it (403)."""
    try:
        size = request.headers.get("content-length")
        if size is None or not size.isdigit() or int(size) > _MAX_FORM_BYTES:
            raise CsrfFailed("a form without a length, or larger than 64 KiB")
        form = await request.form(max_files=0, max_fields=50)
        check_csrf(request, form)
    except CsrfFailed as exc:
        return render(
            request, "error.html", account, status=403, title="Form refused", message=str(exc)
        )
    return form


def _page(console: Console, handler: Page) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        account = current(request, console.accounts)
        if account is None:
            if request.query_params.get("fragment") == "1":
                return Response("sign in again", status_code=401)
            return sign_in_redirect(request)
        return await handler(console, request, account)

    return endpoint


def _action(console: Console, handler: Action) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        account = current(request, console.accounts)
        if account is None:
            return sign_in_redirect(request)
        form = await _checked_form(request, account)
        if isinstance(form, Response):
            return form
        if not account.may_act:
            log.warning("console: %s (%s) tried %s", account.name, account.role, request.url.path)
            return render(
                request,
                "error.html",
                account,
                status=403,
                title="Not permitted",
                message=f"{account.name} is a {account.role}: this account may look, "
                "not act. Ask for the operator role.",
            )
        log.info("console: %s %s", account.name, request.url.path)
        return await handler(console, request, account, form)

    return endpoint


def _public_form(
    console: Console, handler: Callable[[Console, Request, Any], Awaitable[Response]]
) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        form = await _checked_form(request, None)
        if isinstance(form, Response):
            return form
        return await handler(console, request, form)

    return endpoint


def create_app(
    console: Console,
    *,
    secret: str | None = None,
    secure_cookie: bool = False,
    session_s: int = 8 * 3600,
) -> Starlette:
    """``secret`` signs the session cookie: without one each process makes its own, and a
    restart signs everyone out."""

    async def events(request: Request) -> Response:
        if current(request, console.accounts) is None:
            return Response("sign in again", status_code=401)
        return StreamingResponse(
            console.hub.stream(),
            media_type="text/event-stream",
            headers={"x-accel-buffering": "no"},
        )

    async def login_page(request: Request) -> Response:
        return await operations.login_form(console, request)

    async def home(request: Request) -> Response:
        return RedirectResponse("/sagas", status_code=303)

    p = {
        name: _page(console, getattr(pages, name))
        for name in (
            "sagas",
            "saga",
            "saga_report",
            "people",
            "dead_letters",
            "dead_letter",
            "rejections",
            "catalog",
            "health",
        )
    }
    routes = [
        Route("/", home),
        Route("/login", login_page, methods=["GET"]),
        Route("/login", _public_form(console, operations.login), methods=["POST"]),
        Route("/logout", _public_form(console, operations.logout), methods=["POST"]),
        Route("/sagas", p["sagas"]),
        Route("/sagas/abort-all", _action(console, operations.abort_all), methods=["POST"]),
        Route("/sagas/{saga_id}", p["saga"]),
        Route("/sagas/{saga_id}/report.md", p["saga_report"]),
        Route("/sagas/{saga_id}/{decision}", _action(console, operations.decide), methods=["POST"]),
        Route("/people", p["people"]),
        Route("/dead-letters", p["dead_letters"]),
        Route("/dead-letters/replay", _action(console, operations.replay), methods=["POST"]),
        Route("/dead-letters/{dl_id}", p["dead_letter"]),
        Route(
            "/dead-letters/{dl_id}/discard", _action(console, operations.discard), methods=["POST"]
        ),
        Route("/rejections", p["rejections"]),
        Route("/catalog", p["catalog"]),
        Route("/health", p["health"]),
        Route("/events", events),
        Mount("/static", StaticFiles(directory=Path(__file__).with_name("static")), name="static"),
    ]
    middleware = [
        Middleware(SecurityHeaders),
        Middleware(
            SessionMiddleware,
            secret_key=secret or secrets.token_urlsafe(32),
            session_cookie="saga_console",
            max_age=session_s,
            same_site="strict",
            https_only=secure_cookie,
        ),
    ]
    return Starlette(routes=routes, middleware=middleware)
