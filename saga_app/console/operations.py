"""The console's forms: signing in and out, and the operations an operator performs. Each
operation is the CLI's own command, sent for the signed-in person; a destructive one is asked
to confirm first, on a page of its own (so it works without JavaScript too)."""

from __future__ import annotations

import asyncio
import hashlib
import re
import secrets
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from saga_app.console import actions
from saga_app.console.accounts import Account
from saga_app.console.reads import BadFilter, SagaFilter, letter_number, well_formed
from saga_app.console.web import current, flash, local_path, render
from saga_coordinator.desk import DeadLetterNotFound

if TYPE_CHECKING:
    from saga_app.console.app import Console


async def login_form(console: Console, request: Request) -> Response:
    if current(request, console.accounts) is not None:
        return RedirectResponse(local_path(request.query_params.get("next")), status_code=303)
    return render(
        request, "login.html", None, next=local_path(request.query_params.get("next")), error=""
    )


async def login(console: Console, request: Request, form: Any) -> Response:
    name, password = str(form.get("name", ""))[:64], str(form.get("password", ""))
    target = local_path(str(form.get("next", "")))
    client = request.client.host if request.client else "?"
    if not (console.sign_ins.allow(f"name:{name}") and console.sign_ins.allow(f"ip:{client}")):
        return render(
            request,
            "login.html",
            None,
            status=429,
            next=target,
            error="Too many attempts: wait a minute and try again.",
        )
    account = await asyncio.to_thread(console.accounts.check, name, password)
    if account is None:
        return render(
            request,
            "login.html",
            None,
            status=401,
            next=target,
            error="That name and password do not match an account.",
        )
    request.session.clear()  # a new session: nothing chosen before sign-in carries over
    request.session.update({"user": account.name, "role": account.role})
    return RedirectResponse(target, status_code=303)


async def logout(console: Console, request: Request, form: Any) -> Response:
    request.session.clear()
    return RedirectResponse("/login", status_code=303)


def _confirm(
    request: Request, account: Account, form: Any, question: str, consequence: str
) -> Response:
    fields = {k: str(v) for k, v in form.items() if k not in ("csrf", "confirmed")}
    return render(
        request,
        "confirm.html",
        account,
        question=question,
        consequence=consequence,
        fields=fields,
        action=request.url.path,
        back=request.headers.get("referer", ""),
    )


def _confirmed(form: Any) -> bool:
    return bool(form.get("confirmed") == "yes")


def _client(console: Console) -> Any:
    if console.client is None:
        raise actions.ActionRefused("this console has no broker connection: it only reads")
    return console.client


async def decide(console: Console, request: Request, account: Account, form: Any) -> Response:
    saga_id, decision = request.path_params["saga_id"], request.path_params["decision"]
    back = f"/sagas/{saga_id}"
    state = await console.reads.store.get(saga_id) if well_formed(saga_id) else None
    if state is None or decision not in actions.DECISIONS:
        flash(request, f"no saga {saga_id[:128]} or no such decision", "error")
        return RedirectResponse("/sagas", status_code=303)
    text = str(form.get("text", ""))
    try:
        actions.checked_text(decision, text)
        if actions.DECISIONS[decision][2] and not _confirmed(form):
            return _confirm(
                request,
                account,
                form,
                f"{decision.capitalize()} saga {saga_id}?",
                _consequence(decision),
            )
        done = await actions.decide(_client(console), account.name, decision, state, text)
        flash(request, done.message)
    except actions.ActionRefused as exc:
        flash(request, str(exc), "error")
    return RedirectResponse(back, status_code=303)


def _consequence(decision: str) -> str:
    return {
        "abort": "Forward progress stops; everything that may have landed is compensated.",
        "reject": "The saga does not go past its gate; what landed before it is compensated.",
        "resolve": "You take the saga over: it ends as resolved and nothing more is "
        "compensated by the system. Its order is freed.",
        "happened": "You say the step happened (you checked the system itself): the saga goes "
        "on as if its outcome had come in time.",
        "did_not_happen": "You say the step did not happen: its service fences its key first "
        "(refused while a call holds it), then the steps before it are compensated.",
    }.get(decision, "")


BULK_MOST = 500  # sagas one bulk abort may stop: more is a filter to narrow, not a click


def fingerprint(items: Sequence[object]) -> str:
    """What a person confirmed, in 16 characters: acted upon only if the list is still it."""
    return hashlib.sha256(repr(sorted(map(str, items))).encode()).hexdigest()[:16]


def _unchanged(form: Any, items: Sequence[object], what: str) -> None:
    if form.get("expected") != fingerprint(items):
        raise actions.ActionRefused(
            f"the {what} changed since you confirmed ({len(items)} now): look again"
        )


async def abort_all(console: Console, request: Request, account: Account, form: Any) -> Response:
    """Abort every saga of a filtered list that can be stopped, once a person confirmed how
    many; refused when the list changed in between (what they saw is what is acted on)."""
    query = {k: str(form.get(k, ""))[:200] for k in ("status", "saga", "order", "since", "until")}
    back = "/sagas?" + urlencode({k: v for k, v in query.items() if v})
    reason = str(form.get("reason", ""))
    try:
        wanted = SagaFilter.parse(query)
        actions.checked_text("abort", reason)
        sagas = await console.reads.abortable(wanted, BULK_MOST + 1)
        if not sagas:
            raise actions.ActionRefused("no saga of this list is running, waiting or awaiting "
                                        "approval: nothing to abort")  # fmt: skip
        if len(sagas) > BULK_MOST:
            raise actions.ActionRefused(f"over {BULK_MOST} sagas match: narrow the filter")
        if not _confirmed(form):
            batch = secrets.token_hex(8)
            return _confirm(
                request, account, {**form, "expected": fingerprint(sagas), "batch": batch},
                f"Abort {len(sagas)} saga(s)?", _consequence("abort"),
            )  # fmt: skip
        _unchanged(form, sagas, "sagas of this list")
        batch = str(form.get("batch", ""))
        if not re.fullmatch(r"[0-9a-f]{16}", batch):
            raise actions.ActionRefused("not a confirmation of this console: look again")
        done = await actions.abort_many(_client(console), account.name, sagas, reason, batch)
        flash(request, done.message)
    except (actions.ActionRefused, BadFilter) as exc:
        flash(request, str(exc), "error")
    return RedirectResponse(back, status_code=303)


async def replay(console: Console, request: Request, account: Account, form: Any) -> Response:
    note = str(form.get("note", ""))[:2000]
    dl_id, order, reason = (str(form.get(k, "")) for k in ("id", "order", "reason"))
    try:
        if dl_id:
            number = letter_number(dl_id)
            if number is None:
                raise actions.ActionRefused("not a dead letter number")
            done = await actions.replay(
                _client(console), account.name, dead_letter_id=number, note=note
            )
        elif order or reason:
            if (order and not well_formed(order)) or len(reason) > 200 or not reason.isprintable():
                raise actions.ActionRefused(
                    "not a replay this console can send: an order is an ID, a reason up to "
                    "200 printable characters"
                )
            ids = await console.reads.dead_ids(order or None, None if order else reason)
            if not ids:
                raise actions.ActionRefused("nothing to replay: no dead letter left there")
            if not _confirmed(form):
                what = f"order {order}" if order else f"reason {reason}"
                return _confirm(
                    request,
                    account,
                    {**form, "expected": fingerprint(ids)},
                    f"Replay {len(ids)} dead letter(s) of {what}?",
                    "Each is republished to where it was first headed, in its "
                    "order's arrival order.",
                )
            _unchanged(form, ids, "dead letters")
            done = await actions.replay(
                _client(console), account.name, order_id=order or None,
                death_reason=None if order else reason, note=note,
            )  # fmt: skip
        else:
            raise actions.ActionRefused("say which dead letters to replay")
        flash(request, done.message)
    except actions.ActionRefused as exc:
        flash(request, str(exc), "error")
    return RedirectResponse(local_path(str(form.get("back", "/dead-letters"))), status_code=303)


async def discard(console: Console, request: Request, account: Account, form: Any) -> Response:
    dl_id = letter_number(request.path_params["dl_id"])
    try:
        found = await console.reads.dead_letter(dl_id)
        assert dl_id is not None  # there is a letter with this number
    except DeadLetterNotFound:
        flash(request, "no such dead letter", "error")
        return RedirectResponse("/dead-letters", status_code=303)
    reason = str(form.get("reason", ""))[:2000]
    try:
        if not reason.strip():
            raise actions.ActionRefused("discard needs a reason, for the audit trail")
        if not _confirmed(form):
            return _confirm(
                request,
                account,
                form,
                f"Discard dead letter {dl_id}?",
                f"Discarding it means: {found['discard_means']}",
            )
        done = await actions.discard(_client(console), account.name, dl_id, reason)
        flash(request, done.message)
    except actions.ActionRefused as exc:
        flash(request, str(exc), "error")
    return RedirectResponse(f"/dead-letters/{dl_id}", status_code=303)
