#!/usr/bin/env bash
# Set up, then run the coordinator and the four adapters with the demo agent; Ctrl-C stops.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/saga run all --demo "$@"
