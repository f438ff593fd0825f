#!/usr/bin/env bash
# Set up, then lint, type-check and run every test against the real RabbitMQ and PostgreSQL.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
.venv/bin/pytest "$@"
