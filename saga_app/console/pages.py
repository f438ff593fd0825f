"""The console's pages: every one a read, rendered from the database as it stands."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response

from saga_app.console.accounts import Account
from saga_app.console.actions import DECISIONS
from saga_app.console.health import health as health_of
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
from saga_coordinator import authority
from saga_coordinator.desk import DeadLetterNotFound
from saga_coordinator.register import SagaState
from saga_shared.model.messages import Sender

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


# The command each decision sends: what the coordinator's authority rules are about.
_COMMAND = {
    "approve": "saga.approve", "reject": "saga.reject", "abort": "saga.abort",
    "resume": "saga.resume", "resolve": "saga.resolve",
    "happened": "saga.settle", "did_not_happen": "saga.settle",
}  # fmt: skip


def available(state: SagaState, account: Account, person: bool) -> tuple[str, ...]:
    """The decisions to offer: those the saga's status allows that the coordinator would take
    from this account (``saga_coordinator.authority``, the one place that decides). The
    console vouches for a person (``Console.is_person``) as a person, for anyone else as an
    operator: an operator is not offered to resolve, to settle a step in doubt, or
    to decide at a gate that needs a person."""
    waiting = any(s.status == "in_doubt" and not s.settling for s in state.steps)
    offered = (
        IN_DOUBT if state.status == "needs_human" and waiting else AVAILABLE.get(state.status, ())
    )
    sender = Sender(user=account.name, role="person" if person else "ops")
    gate = next((s.gate for s in state.steps if s.gate_status == "waiting" and s.gate), None)

    def allowed(decision: str) -> bool:
        if authority.may_act(state, _COMMAND[decision], sender) is not None:
            return False
        if decision in ("approve", "reject") and gate is not None:
            return authority.may_decide_gate(gate.require_person, sender) is None
        return True

    return tuple(d for d in offered if allowed(d))


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
        deadline=found["deadline"],
        decisions=DECISIONS,
        available=available(state, account, console.is_person(account.name)),
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
        by_error=groups["by_error"],
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
    return render(request, "dead_letter.html", account, d=found, trace_url=console.trace_url)


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


async def health(console: Console, request: Request, account: Account) -> Response:
    rows = await console.reads.processes()
    depths = await console.depths()
    figures = health_of(rows, depths, console.reads.topology, console.silent_after_s)
    template = "_health.html" if request.query_params.get("fragment") == "1" else "health.html"
    return render(request, template, account, h=figures, broker=console.client is not None)
