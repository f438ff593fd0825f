"""The plain-text rendering of an order's effects (pure)."""

from __future__ import annotations

from services.effects import render_effects


def test_empty_sections_say_none() -> None:
    text = render_effects({})

    for section in ("reservations", "credit_notes", "charges", "emails", "applied"):
        assert f"{section} (0)\n  (none)" in text
    assert "WARNING" not in text


def test_rows_are_aligned_and_timestamps_shortened() -> None:
    text = render_effects(
        {
            "reservations": [
                {"reservation_id": "res-1", "status": "released", "released_at": None},
                {"reservation_id": "res-22", "status": "reserved", "released_at": None},
            ],
            "emails": [{"email_id": "em-1", "sent_at": "2026-01-02T03:04:05.678901+00:00"}],
        }
    )
    lines = text.splitlines()

    assert lines[1] == "  reservation_id  status    released_at"
    assert lines[3] == "  res-1           released  -"
    assert "2026-01-02 03:04:05" in text
    assert ".678901" not in text


def test_an_effect_applied_twice_is_called_out() -> None:
    applied = [
        {"action": "a.b", "idempotency_key": "k1", "entity_id": "x", "times": 1},
        {"action": "a.c", "idempotency_key": "k2", "entity_id": "y, z", "times": 2},
    ]
    text = render_effects({"applied": applied})

    assert text.endswith("WARNING: applied more than once for key(s): k2")
