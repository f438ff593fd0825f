"""UUID text without ``uuid.UUID`` objects: the same strings ``str(uuid.uuid5(...))`` and
``str(uuid.uuid4())`` give, at a third of the cost (the object's construction is most of it).
Every command and message takes one or two of these on the hot path."""

from __future__ import annotations

import contextlib
import hashlib
import os
import uuid
from collections.abc import Callable, Iterator

# Where random ids come from: the OS, but for a deterministic simulation (``seeded``).
_entropy: Callable[[int], bytes] = os.urandom


def _text(raw: bytes, version: int) -> str:
    octets = bytearray(raw[:16])
    octets[6] = (octets[6] & 0x0F) | (version << 4)
    octets[8] = (octets[8] & 0x3F) | 0x80  # the RFC 4122 variant
    h = octets.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def name_id(namespace: uuid.UUID, name: str) -> str:
    """``str(uuid.uuid5(namespace, name))``: ids derived from names must never change."""
    return _text(hashlib.sha1(namespace.bytes + name.encode(), usedforsecurity=False).digest(), 5)


def random_id() -> str:
    """``str(uuid.uuid4())``."""
    return _text(_entropy(16), 4)


@contextlib.contextmanager
def seeded(entropy: Callable[[int], bytes]) -> Iterator[None]:
    """Random ids from ``entropy`` (a seeded ``random.Random().randbytes``) while open: the
    deterministic simulation replays a run bit for bit."""
    global _entropy
    before, _entropy = _entropy, entropy
    try:
        yield
    finally:
        _entropy = before
