#!/usr/bin/env bash
# Set up, give every role its own account on the local broker and database (`saga setup`,
# passwords in .secrets/), then run the coordinator and the four adapters, each connected as its
# own role, with the demo agent. Ctrl-C stops.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export SAGA_IDENTITY=roles SAGA_SECRETS_DIR="$PWD/.secrets" SAGA_PEOPLE="${SAGA_PEOPLE:-ana}"
.venv/bin/saga --log-level WARNING setup
exec .venv/bin/saga run all --demo "$@"
