"""The incident report: the register told in its own terms, for a person or a ticket.

What was done, what was put back (by which compensation, with its identifier), what residue the
customer will see, what never happened, and who decided what, when.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from saga_coordinator.register import SagaState, Step
from saga_shared.model.catalog import ActionClass


def _ids(result: dict[str, Any] | None) -> dict[str, Any]:
    return {k: v for k, v in (result or {}).items() if k.endswith("_id") and v}


def _known_done(step: Step) -> bool:
    """Done, and known to be: a step whose outcome was unknown counts only once settled."""
    ran = step.status in ("done", "compensated", "compensation_failed")
    return ran and (not step.effect_unknown or step.settled == "happened")


def _may_have_happened(step: Step) -> bool:
    unsettled = step.effect_unknown and step.settled is None
    return step.status == "in_doubt" or (
        unsettled and step.status in ("failed", "compensated", "compensation_failed")
    )


def _never_happened(step: Step) -> bool:
    if step.status in ("skipped", "pending") or step.settled == "did_not_happen":
        return True
    return (
        step.status == "failed"
        and not step.effect_unknown
        and step.action_class is not ActionClass.READ_ONLY
    )


def incident(state: SagaState) -> dict[str, Any]:
    steps = state.steps
    return {
        "saga_id": state.saga_id,
        "saga": state.saga,
        "order_id": state.order_id,
        "status": state.status,
        "reason": state.reason,
        "needs_human_reason": state.needs_human_reason,
        "done": [
            {
                "step": s.index,
                "action": s.action,
                "identifiers": _ids(s.result),
                "at": s.finished_at,
            }
            for s in steps
            if _known_done(s)
        ],
        "may_have_happened": [
            {
                "step": s.index,
                "action": s.action,
                "why": s.doubt or s.error or "",
                "at": s.finished_at,
            }
            for s in steps
            if _may_have_happened(s)
        ],
        "put_back": [
            {
                "step": s.index,
                "action": s.action,
                "by": s.compensation,
                "identifiers": _ids(s.compensation_result),
                "at": s.compensated_at,
            }
            for s in sorted(steps, key=lambda s: s.compensated_at or state.created_at)
            if s.compensation_status == "compensated"
        ],
        "not_put_back": [
            {"step": s.index, "action": s.action, "why": _why_not(s)}
            for s in steps
            if s.compensation_status in ("pending", "running", "failed", "impossible")
        ],
        "residue": [
            {"step": s.index, "action": s.action, "residue": s.residue}
            for s in steps
            if s.residue and s.status in ("compensated", "compensation_failed")
        ]
        + [
            {"step": s.index, "action": s.action, "residue": IRREVERSIBLE_RESIDUE}
            for s in steps
            if s.compensation_status == "impossible"
        ],
        "never_happened": [
            {"step": s.index, "action": s.action, "why": _never(s)}
            for s in steps
            if _never_happened(s)
        ],
        "decisions": [d.model_dump(mode="json") for d in state.decisions],
    }


IRREVERSIBLE_RESIDUE = "irreversible and already done; it cannot be undone"


def _why_not(step: Step) -> str:
    if step.compensation_status == "impossible":
        return "irreversible: there is no way back"
    if step.compensation_status == "failed":
        return f"{step.compensation} failed: {step.compensation_error}"
    return f"{step.compensation} not done yet"


def _never(step: Step) -> str:
    if step.settled == "did_not_happen":
        return f"its key was fenced before it ran (said by {step.settled_by})"
    if step.status == "failed":
        return f"failed, nothing changed: {step.error}"
    return ""


def render_markdown(state: SagaState) -> str:
    """The same report as a document to attach to a ticket."""
    r = incident(state)
    lines = [
        f"# Saga {r['saga_id']} ({r['saga']}), order {r['order_id']}",
        "",
        f"**Outcome:** {r['status']}" + (f" — {r['reason']}" if r["reason"] else ""),
    ]
    if r["needs_human_reason"]:
        lines.append(f"**Needs a person:** {r['needs_human_reason']}")
    sections: list[tuple[str, list[dict[str, Any]], Callable[[dict[str, Any]], str]]] = [
        ("What was done", r["done"], lambda x: f"{x['action']} {_fmt_ids(x['identifiers'])}"),
        ("What may have happened (in doubt)", r["may_have_happened"],
         lambda x: f"{x['action']}: {x['why']}"),
        ("What was put back", r["put_back"],
         lambda x: f"{x['action']} undone by {x['by']} {_fmt_ids(x['identifiers'])}"),
        ("What was not put back", r["not_put_back"], lambda x: f"{x['action']}: {x['why']}"),
        ("Residue the customer will see", r["residue"], lambda x: f"{x['action']}: {x['residue']}"),
        ("What never happened", r["never_happened"],
         lambda x: x["action"] + (f": {x['why']}" if x["why"] else "")),
        ("Who decided what", r["decisions"],
         lambda x: f"{x['at']} {x['kind']} by {_who(x['by'], x['role'])}{_said(x['note'])}"),
    ]  # fmt: skip
    for title, items, line in sections:
        lines += ["", f"## {title}", ""]
        lines += [f"- {line(item)}" for item in items] or ["- nothing"]
    return "\n".join(lines) + "\n"


def _fmt_ids(ids: dict[str, Any]) -> str:
    return "(" + ", ".join(f"{k} {v}" for k, v in ids.items()) + ")" if ids else ""


def render_summary(state: SagaState) -> str:
    """The report's sections for a terminal, under the register table of ``saga show``."""
    r = incident(state)
    sections = {
        "put back": [
            f"step {x['step']} {x['action']} by {x['by']} {_fmt_ids(x['identifiers'])}".rstrip()
            for x in r["put_back"]
        ],
        "residue": [f"step {x['step']} {x['action']}: {x['residue']}" for x in r["residue"]],
        "may have happened": [
            f"step {x['step']} {x['action']}: {x['why']}" for x in r["may_have_happened"]
        ],
        "never happened": [
            f"step {x['step']} {x['action']}" + (f" ({x['why']})" if x["why"] else "")
            for x in r["never_happened"]
        ],
        "decisions": [
            f"{d.at:%Y-%m-%d %H:%M:%S} {d.kind} by {_who(d.by, d.role)}{_said(d.note)}"
            for d in state.decisions
        ],
    }
    return "\n".join(
        f"{title}:\n" + "\n".join(f"  {line}" for line in lines)
        for title, lines in sections.items()
        if lines
    )


def _said(note: str) -> str:
    """A decision's note after a colon; nothing at all for a decision sent without one."""
    return f": {note}" if note.strip() else ""


def _who(by: str, role: str) -> str:
    """The verified account that decided, and what it is (``ann (person)``)."""
    if not by:
        return "unknown"
    return f"{by} ({role})" if role else by
