"""Text from outside, made safe to store and show."""

from __future__ import annotations

from saga_shared.model.text import clean, first_unsafe


def test_clean_escapes_controls_and_replaces_lone_surrogates() -> None:
    assert clean("a\x00b\x1b[2Jc\ud800d\x9b") == "a\\x00b\\x1b[2Jc\ufffdd\\x9b"


def test_clean_keeps_tabs_newlines_and_ordinary_unicode() -> None:
    assert clean("line\n\tcafé ✓ 日本") == "line\n\tcafé ✓ 日本"


def test_clean_cuts_to_the_limit() -> None:
    assert clean("x" * 50, 10) == "x" * 9 + "…"


def test_the_cleaned_text_is_storable_and_encodable() -> None:
    cleaned = clean("".join(chr(c) for c in range(0x00, 0xE000, 7)), 100_000)

    assert first_unsafe(cleaned) is None
    cleaned.encode("utf-8")  # no lone surrogate left


def test_first_unsafe_names_the_character_and_where() -> None:
    assert first_unsafe("ok") is None
    assert first_unsafe("ab\x07") == "a control character (U+0007) at position 2"
    assert first_unsafe("\udfff") == "a lone surrogate (U+DFFF) at position 0"
