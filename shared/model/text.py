"""Text that came from outside, made safe to store, log and show.

Postgres refuses NUL in ``text`` and ``jsonb``, JSON encoders refuse lone surrogates, and a
control character printed on an operator's terminal can rewrite what they see. Every string that
an untrusted party could have chosen passes through ``clean`` before it is stored in a text
column, logged, or put into a reply.
"""

from __future__ import annotations

import re

# C0 controls except tab, newline and carriage return; DEL; C1 controls (U+0080-U+009F, which
# some terminals read as escape sequences); lone surrogates (U+D800-U+DFFF).
UNSAFE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    if "\ud800" <= char <= "\udfff":
        return "\ufffd"
    return f"\\x{ord(char):02x}"


def clean(text: str, limit: int = 2000) -> str:
    """``text`` with unsafe characters escaped (``\\x00``) or replaced (surrogates), cut to
    ``limit`` characters."""
    if UNSAFE.search(text):
        text = UNSAFE.sub(_escape, text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def first_unsafe(text: str) -> str | None:
    """A description of the first character ``clean`` would change, or None."""
    found = UNSAFE.search(text)
    if found is None:
        return None
    char = found.group()
    kind = "a lone surrogate" if "\ud800" <= char <= "\udfff" else "a control character"
    return f"{kind} (U+{ord(char):04X}) at position {found.start()}"


def header_text(value: object, limit: int = 255) -> str | None:
    """An AMQP header's value as safe text (bytes decoded, unsafe characters escaped, cut to
    ``limit``), or None when it is not text: a sender chooses headers."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return clean(value, limit) if isinstance(value, str) else None
