"""The exception root of the adapters and the simulated systems.

"Retry later" (``TransientFailure``) and "the system said no" (``PermanentFailure``) are distinct
types so the adapter decides retry versus report from the type alone, never from message text.
"""

from __future__ import annotations

from shared.errors import SagaError


class AdapterError(SagaError):
    """Root of every error raised on purpose by ``services``."""


class TransientFailure(AdapterError):
    """The call did not land (or may not have): the same call may work later."""


class PermanentFailure(AdapterError):
    """The system refused the call; retrying with the same input will not change the answer."""
