"""Crash rehearsal: ``SAGA_CRASH_POINT=<name>`` makes the process die at that point, exactly as a
``kill -9`` there would (no cleanup, no ack, no flush). For drills and tests of crash safety,
like fault injection; unset, it costs one dictionary lookup.

Points: ``coordinator.before_ack`` (a message's transaction committed, not yet acked),
``relay.before_publish`` (outgoing messages committed, not yet published), ``relay.after_publish``
(published, not yet marked sent), ``adapter.before_publish`` (the external system was called, its
outcome not yet published).
"""

from __future__ import annotations

import os

CRASH_EXIT = 70


def crash_point(name: str) -> None:
    if os.environ.get("SAGA_CRASH_POINT") == name:
        os._exit(CRASH_EXIT)
