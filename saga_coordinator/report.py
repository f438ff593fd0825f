"""Renders a register for people: a table, then the errors and residues in full sentences."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from saga_coordinator.incident import render_summary
from saga_coordinator.register import SagaState, Step


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [
        [str(h) for h in headers],
        *[["-" if v in (None, "") else str(v) for v in r] for r in rows],
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _identifiers(step: Step) -> str:
    if not step.result:
        return ""
    wanted = step.result_fields or tuple(step.result)
    return ", ".join(f"{k}={step.result[k]}" for k in wanted if k in step.result)


def render_register(state: SagaState) -> str:
    head = [
        f"saga {state.saga_id}  ({state.saga})  order {state.order_id}",
        f"status: {state.status}",
    ]
    if state.reason:
        head.append(f"reason: {state.reason}")
    if state.needs_human_reason:
        head.append(f"needs a person because: {state.needs_human_reason}")
    rows = [
        (
            s.index,
            s.action,
            s.action_class.value,
            s.status,
            s.attempts,
            _identifiers(s),
            s.compensation,
            s.compensation_status if s.compensation_status != "none" else "",
        )
        for s in state.steps
    ]
    headers = ("#", "action", "class", "status", "tries", "identifiers", "compensation", "undo")
    parts = ["\n".join(head), table(headers, rows)]
    errors = [
        f"  step {s.index} {s.action}: {s.error}"
        + (" (effect unknown)" if s.effect_unknown else "")
        for s in state.steps
        if s.error
    ] + [
        f"  step {s.index} {s.compensation}: {s.compensation_error}"
        for s in state.steps
        if s.compensation_error
    ]
    if errors:
        parts.append("errors:\n" + "\n".join(errors))
    summary = render_summary(state)
    if summary:
        parts.append(summary)
    return "\n".join(parts)
