#!/usr/bin/env bash
# Set up, then lint, type-check and run every test against the real RabbitMQ and PostgreSQL.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The AsyncAPI project's parser reads the published contract in a test (tests/contract).
if [ ! -d tests/contract/node_modules/@asyncapi/parser ]; then
    npm ci --prefix tests/contract --no-audit --no-fund --loglevel error
fi
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
.venv/bin/lint-imports --no-cache
.venv/bin/pytest "$@"
