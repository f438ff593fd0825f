"""``python -m tests.chaos --sagas 10000 [--seed S] [--kill-every SECONDS]``: the big chaos run."""

from __future__ import annotations

import sys

from tests.chaos.cli import main

sys.exit(main())
