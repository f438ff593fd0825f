"""An order's effects as tables for a person (pure): the sections, their cells, and the warning
about an effect applied twice."""

from __future__ import annotations

from saga_app.output import plain_table
from saga_services.effects import applied_twice, effect_tables


def test_every_section_is_there_and_an_empty_one_says_none() -> None:
    tables = effect_tables({})

    assert [title for title, _, _ in tables] == [
        "reservations (0)", "credit_notes (0)", "charges (0)", "emails (0)", "applied (0)",
        "calls (0)",
    ]  # fmt: skip
    for title, headers, rows in tables:
        assert plain_table(headers, rows, title=title) == f"{title}\n  (none)"
    assert applied_twice({}) == []


def test_rows_are_aligned_under_their_section_and_timestamps_shortened() -> None:
    effects: dict[str, list[dict[str, object]]] = {
        "reservations": [
            {"reservation_id": "res-1", "status": "released", "released_at": None},
            {"reservation_id": "res-22", "status": "reserved", "released_at": None},
        ],
        "emails": [{"email_id": "em-1", "sent_at": "2026-01-02T03:04:05.678901+00:00"}],
    }
    reservations, _, _, emails, _, _ = effect_tables(effects)

    lines = plain_table(reservations[1], reservations[2], title=reservations[0]).splitlines()
    assert lines[0] == "reservations (2)"
    assert lines[1] == "  reservation_id  status    released_at"
    assert lines[3] == "  res-1           released  -"
    assert emails[2] == [["em-1", "2026-01-02 03:04:05"]]


def test_an_effect_applied_twice_is_called_out() -> None:
    applied = [
        {"action": "a.b", "idempotency_key": "k1", "entity_id": "x", "times": 1},
        {"action": "a.c", "idempotency_key": "k2", "entity_id": "y, z", "times": 2},
    ]

    assert applied_twice({"applied": applied}) == ["k2"]
