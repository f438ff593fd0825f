"""The processes' loop: the garbage collector tuned for a message loop before it starts."""

from __future__ import annotations

import gc

from saga_shared import loop


def test_the_collector_skips_what_was_loaded_at_start_and_runs_less_often() -> None:
    before = gc.get_threshold()
    try:

        async def threshold() -> tuple[int, int, int]:
            return gc.get_threshold()

        assert loop.run(threshold()) == (loop.GC_YOUNG, before[1], before[2])
        assert gc.get_freeze_count() > 0  # the modules imported so far are out of its scans
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
