"""The console's pages: every one a read, rendered from the database as it stands."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response

from saga_app.console.accounts import Account
from saga_app.console.actions import DECISIONS
from saga_app.console.reads import (
    PAGE,
    STATUSES,
    BadFilter,
    SagaFilter,
    cursor_of,
    id_filter,
    letter_number,
    text_filter,
    well_formed,
)
from saga_app.console.web import render
from saga_coordinator.desk import DeadLetterNotFound
from saga_coordinator.register import SagaState

if TYPE_CHECKING:
    from saga_app.console.app import Console

LETTER_STATUSES = ("dead", "replayed", "discarded")
# Which decisions a saga in each status can take, in the order the buttons show.
AVAILABLE: dict[str, tuple[str, ...]] = {
    "running": ("abort",),
    "waiting": ("abort",),
    "awaiting_approval": ("approve", "reject", "abort"),
    "needs_human": ("resume", "resolve"),
}
# A saga stopped on a step in doubt: a person says which way it went, or asks its service again.
IN_DOUBT = ("happened", "did_not_happen", "resume", "resolve")


def available(state: SagaState, account: Account, people: frozenset[str]) -> tuple[str, ...]:
    """The decisions to offer; settling a step in doubt only to a person of the deployment
    (``SAGA_PEOPLE``), who is the one the coordinator believes about it."""
    waiting = any(s.status == "in_doubt" and not s.settling for s in state.steps)
    if state.status == "needs_human" and waiting:
        return IN_DOUBT if account.name in people else IN_DOUBT[2:]
    return AVAILABLE.get(state.status, ())


def _query(request: Request) -> dict[str, str]:
    return {k: v for k, v in request.query_params.items() if isinstance(v, str)}


async def sagas(console: Console, request: Request, account: Account) -> Response:
    query = _query(request)
    fragment = query.get("fragment") == "1"
    try:
        wanted = SagaFilter.parse(query)
        error = ""
    except BadFilter as exc:
        wanted, error = SagaFilter(), str(exc)
    rows = await console.reads.sagas(wanted, PAGE + 1) if not error else []
    more = len(rows) > PAGE
    rows = rows[:PAGE]
    after = cursor_of(rows[-1]) if more else ""
    values: dict[str, Any] = {
        "rows": rows,
        "counts": await console.reads.counts(),
        "query": query,
        "error": error,
        "statuses": STATUSES,
        "saga_names": sorted(console.catalog.sagas),
        "after": after,
        "next_query": {
            **{k: v for k, v in query.items() if k not in ("after", "fragment")},
            "after": after,
        },
    }
    template = "_sagas.html" if fragment else "sagas.html"
    return render(request, template, account, status=400 if error else 200, **values)


async def saga(console: Console, request: Request, account: Account) -> Response:
    saga_id = request.path_params["saga_id"]
    found = await console.reads.saga(saga_id) if well_formed(saga_id) else None
    if found is None:
        return render(
            request,
            "error.html",
            account,
            status=404,
            title="No such saga",
            message=f"There is no saga {saga_id[:128]!r}.",
        )
    state = found["state"]
    return render(
        request,
        "saga.html",
        account,
        s=state,
        r=found["report"],
        history=found["history"],
        blocks=found["blocks"],
        parked=found["parked"],
        decisions=DECISIONS,
        available=available(state, account, console.people),
    )


async def saga_report(console: Console, request: Request, account: Account) -> Response:
    saga_id = request.path_params["saga_id"]
    found = await console.reads.saga(saga_id) if well_formed(saga_id) else None
    if found is None:
        return Response(f"no saga {saga_id[:128]}\n", status_code=404, media_type="text/plain")
    name = "".join(c if c.isalnum() or c in "-_." else "_" for c in saga_id)
    return Response(
        found["markdown"],
        media_type="text/markdown; charset=utf-8",
        headers={"content-disposition": f'attachment; filename="saga-{name}.md"'},
    )


async def people(console: Console, request: Request, account: Account) -> Response:
    queue = await console.reads.people()
    template = "_people.html" if request.query_params.get("fragment") == "1" else "people.html"
    return render(request, template, account, queue=queue, available=AVAILABLE)


async def dead_letters(console: Console, request: Request, account: Account) -> Response:
    query = _query(request)
    status = query.get("status") or "dead"
    try:
        if status not in LETTER_STATUSES:
            raise BadFilter(f"status: one of {', '.join(LETTER_STATUSES)}")
        order, reason, error = id_filter(query, "order"), text_filter(query, "reason"), ""
    except BadFilter as exc:
        status, order, reason, error = "dead", None, None, str(exc)
    rows = [] if error else await console.reads.dead_letters(order, reason, status)
    groups = await console.reads.dead_letter_groups()
    template = "_dead_letters.html" if query.get("fragment") == "1" else "dead_letters.html"
    return render(
        request,
        template,
        account,
        rows=rows,
        status_shown=status,
        statuses=LETTER_STATUSES,
        query=query,
        error=error,
        status=400 if error else 200,
        by_reason=groups["by_reason"],
        by_order=groups["by_order"],
        blocked=groups["blocked"],
    )


async def dead_letter(console: Console, request: Request, account: Account) -> Response:
    try:
        found = await console.reads.dead_letter(letter_number(request.path_params["dl_id"]))
    except DeadLetterNotFound:
        return render(
            request,
            "error.html",
            account,
            status=404,
            title="No such dead letter",
            message="There is no dead letter with that number.",
        )
    return render(request, "dead_letter.html", account, d=found)


async def rejections(console: Console, request: Request, account: Account) -> Response:
    try:
        order, error = id_filter(_query(request), "order"), ""
    except BadFilter as exc:
        order, error = None, str(exc)
    rows = [] if error else await console.reads.rejections(order)
    return render(
        request,
        "rejections.html",
        account,
        status=400 if error else 200,
        rows=rows,
        order=order or "",
        error=error,
    )


async def catalog(console: Console, request: Request, account: Account) -> Response:
    return render(request, "catalog.html", account, catalog=console.catalog)
