"""The exception root of the adapters, and the two errors an adapter's function raises.

"Retry later" (``Transient``) and "the system said no" (``Permanent``) are distinct types so the
framework decides retry versus report from the type alone, never from message text. Each says
whether the effect may have landed anyway, which decides whether the coordinator must undo it.
"""

from __future__ import annotations

from saga_shared.errors import SagaError


class AdapterError(SagaError):
    """Root of every error raised on purpose by ``services``."""


class Transient(AdapterError):
    """The call did not work but the same call may work later (a timeout, a 5xx, a dropped
    connection). ``may_have_landed``: whether the system may have applied it anyway (False
    only when the request provably never reached it, e.g. a refused connection)."""

    def __init__(self, reason: str, *, may_have_landed: bool = True) -> None:
        super().__init__(reason)
        self.may_have_landed = may_have_landed


class Permanent(AdapterError):
    """The system refused the call; retrying with the same input will not change the answer.
    ``may_have_landed``: True when it answered in a way that leaves the effect in doubt (a
    success without the identifiers its compensation needs)."""

    def __init__(self, reason: str, *, may_have_landed: bool = False) -> None:
        super().__init__(reason)
        self.may_have_landed = may_have_landed
