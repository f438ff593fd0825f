"""Points in time as people type them: ``30m``, ``2h``, ``1d`` ago, or an ISO time."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

_RELATIVE = re.compile(r"^(\d{1,9})([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def parse_moment(text: str, now: datetime | None = None) -> datetime:
    """The moment ``text`` names (UTC when it names no zone); ValueError says what is wrong."""
    text = text.strip()
    match = _RELATIVE.match(text)
    if match:
        try:
            return (now or datetime.now(UTC)) - timedelta(**{_UNITS[match[2]]: int(match[1])})
        except OverflowError:
            raise ValueError(f"{text[:40]!r}: too far back") from None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{text[:40]!r}: use 30m, 2h, 1d or an ISO time") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
