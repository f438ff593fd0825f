#!/usr/bin/env bash
# Set everything up on a fresh clone: the broker and the database (reachable, or started by
# scripts/services.sh), virtualenv, install, database schema, topology. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

# SAGA_SETUP_SERVICES=0 (the fast tier) sets up the virtualenv alone.
if [ "${SAGA_SETUP_SERVICES:-1}" = 1 ]; then
    bash scripts/services.sh
    # The URLs of the private instances it started, if any (run.sh and test.sh source it too).
    . "${SAGA_SERVICES_DIR:-.saga/services}.env"
fi

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
# Reinstall only when the dependencies changed.
stamp=.venv/.installed-$(sha256sum pyproject.toml | cut -c1-16)
if [ ! -f "$stamp" ]; then
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[server,dev]"
    rm -f .venv/.installed-*
    touch "$stamp"
fi
if [ "${SAGA_SETUP_SERVICES:-1}" = 1 ]; then
    .venv/bin/saga --log-level WARNING migrate
fi
