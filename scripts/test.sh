#!/usr/bin/env bash
# Set up, then lint, type-check and run every test against the real RabbitMQ and PostgreSQL.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The broker and the database setup.sh found or started (scripts/services.sh): the tests use them.
. "${SAGA_SERVICES_DIR:-.saga/services}.env"
# The AsyncAPI project's parser reads the published contract in a test (tests/contract).
if [ ! -d tests/contract/node_modules/@asyncapi/parser ]; then
    if ! command -v npm > /dev/null; then
        echo "scripts/test.sh: the contract test needs Node.js and npm (apt-get install nodejs npm)" >&2
        exit 1
    fi
    npm ci --prefix tests/contract --no-audit --no-fund --loglevel error
fi
# promtool (Debian's prometheus package) checks the alert rules in a test.
if ! command -v promtool > /dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get > /dev/null; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus > /dev/null
    else
        echo "scripts/test.sh: the alert-rules test needs promtool (apt-get install prometheus)" >&2
        exit 1
    fi
fi
# The console's browser tests drive Debian's Chromium through Playwright.
if [ -z "${SAGA_CHROMIUM:-}" ] && ! command -v chromium > /dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get > /dev/null; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium > /dev/null
    else
        echo "scripts/test.sh: the console's browser tests need Chromium (apt-get install chromium)" >&2
        exit 1
    fi
fi
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
.venv/bin/lint-imports --no-cache
.venv/bin/pytest "$@"
