#!/usr/bin/env bash
# The whole suite: set up, lint, type-check, then run every test (the docs' among them)
# against the real RabbitMQ and PostgreSQL (found or started by scripts/services.sh).
#   bash scripts/test.sh            everything (what CI runs)
#   bash scripts/test.sh --fast     the fast tier: lint, types and the tests marked fast, with
#                                   neither RabbitMQ nor Postgres (tests/conftest.py)
# Other arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
fast=0
if [ "${1:-}" = --fast ]; then
    fast=1
    shift
fi

need_debian_package() {  # command package why
    command -v "$1" > /dev/null && return
    if [ "$(id -u)" = 0 ] && command -v apt-get > /dev/null; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$2" > /dev/null
    else
        echo "scripts/test.sh: $3 needs $1 (apt-get install $2)" >&2
        exit 1
    fi
}

if [ "$fast" = 1 ]; then
    SAGA_SETUP_SERVICES=0 bash scripts/setup.sh
else
    bash scripts/setup.sh
    # The broker and the database setup.sh found or started: the tests use them.
    . "${SAGA_SERVICES_DIR:-.saga/services}.env"
fi
# The AsyncAPI project's parser reads the published contract in a test (tests/unit).
if [ ! -d tests/contract/node_modules/@asyncapi/parser ]; then
    need_debian_package npm npm "the contract test"
    npm ci --prefix tests/contract --no-audit --no-fund --loglevel error
fi
need_debian_package promtool prometheus "the alert-rules test"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
.venv/bin/lint-imports --no-cache
if [ "$fast" = 1 ]; then
    exec .venv/bin/pytest -m fast "$@"
fi
# The console's browser tests drive Debian's Chromium through Playwright.
if [ -z "${SAGA_CHROMIUM:-}" ]; then
    need_debian_package chromium chromium "the console's browser tests"
fi
.venv/bin/pytest "$@"
