#!/usr/bin/env bash
# The benchmark: set up (with the bench extra: DBOS, matplotlib, py-spy), start the services if
# they are down, measure, and write benchmarks/results/ (report.md and PNG plots). 25 to 40 minutes.
# Arguments go to `python -m benchmarks` (try --help).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/services.sh
bash scripts/setup.sh
stamp=.venv/.bench-$(sha256sum pyproject.toml | cut -c1-16)
if [ ! -f "$stamp" ]; then
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[server,dev,bench]"
    rm -f .venv/.bench-*
    touch "$stamp"
fi
exec .venv/bin/python -m benchmarks "$@"
