"""The console's web plumbing: who is signed in, the cross-site request forgery check, the
security headers, and rendering. Every page and form goes through these, so none can forget."""

from __future__ import annotations

import hmac
import secrets
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape
from markupsafe import Markup
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from saga_app.console.accounts import Account, Accounts

TEMPLATES = Environment(
    loader=FileSystemLoader(Path(__file__).with_name("templates")),
    autoescape=select_autoescape(default=True, default_for_string=True),
    undefined=StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)


def when(moment: datetime | str | None, ms: bool = False) -> Markup:
    """A moment in UTC, said so, with its exact value for the page's script to show it in the
    reader's own time zone (the UTC stays in the title): nobody has to guess which zone. A
    moment kept as text (in a JSON history) is read first; text that is no moment is shown."""
    if isinstance(moment, str):
        try:
            moment = datetime.fromisoformat(moment)
        except ValueError:
            return Markup("{0}").format(moment)
    if moment is None:
        return Markup("")
    utc = moment.astimezone(UTC)
    text = utc.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] if ms else utc.strftime("%Y-%m-%d %H:%M:%S")
    return Markup('<time datetime="{0}" title="{1} UTC">{1} UTC</time>').format(
        utc.isoformat(timespec="milliseconds"), text
    )


TEMPLATES.filters["when"] = when
# No inline script or style anywhere: a value that slipped past escaping still cannot run.
SECURITY_HEADERS = {
    "content-security-policy": "default-src 'self'; script-src 'self'; style-src 'self'; "
    "img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; "
    "base-uri 'none'",
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    "x-frame-options": "DENY",
    "cache-control": "no-store",
}


class SecurityHeaders:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {k.lower() for k, _ in headers}
                for name, value in SECURITY_HEADERS.items():
                    if name.encode() not in present:
                        headers.append((name.encode(), value.encode()))
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, with_headers)


class Forbidden(Exception):
    """Signed in, but this person's role may not do this."""


class CsrfFailed(Exception):
    """A form that did not come from a page of this console."""


def csrf_token(request: Request) -> str:
    token = request.session.get("csrf")
    if not isinstance(token, str):
        token = secrets.token_urlsafe(32)
        request.session["csrf"] = token
    return token


def check_csrf(request: Request, form: Any) -> None:
    """A form must carry this session's token, and come from this console's own origin when
    the browser says where it came from."""
    sent, expected = form.get("csrf"), request.session.get("csrf")
    if not isinstance(sent, str) or not isinstance(expected, str):
        raise CsrfFailed("the form has no valid token: reload the page and try again")
    if not hmac.compare_digest(sent.encode(), expected.encode()):
        raise CsrfFailed("the form's token is not this session's: reload the page")
    origin = request.headers.get("origin")
    if origin and origin != "null":
        own = f"{request.url.scheme}://{request.url.netloc}"
        if origin != own:
            raise CsrfFailed(f"a form sent from another site ({origin[:80]})")


def current(request: Request, accounts: Accounts) -> Account | None:
    """The signed-in account, if the session names one the accounts file still has (a person
    removed from the file is signed out at their next request)."""
    name = request.session.get("user")
    account = accounts.by_name.get(name) if isinstance(name, str) else None
    if account is None or request.session.get("role") != account.role:
        return None
    return account


def local_path(target: str | None) -> str:
    """Where to go after signing in: a path of this console only, never another site."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/sagas"
    parts = urlsplit(target)
    return "/sagas" if parts.scheme or parts.netloc else target


def sign_in_redirect(request: Request) -> Response:
    wanted = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(f"/login?next={quote(wanted, safe='')}", status_code=303)


def flash(request: Request, text: str, kind: str = "ok") -> None:
    request.session["flash"] = {"text": text[:4000], "kind": kind}


def render(
    request: Request, template: str, account: Account | None, status: int = 200, **values: Any
) -> HTMLResponse:
    # A list reloaded live is not where the person looks for the outcome of their action.
    shown = None if template.startswith("_") else request.session.pop("flash", None)
    html = TEMPLATES.get_template(template).render(
        account=account, csrf=csrf_token(request), flash=shown, path=request.url.path, **values
    )
    return HTMLResponse(html, status_code=status)
