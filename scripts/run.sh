#!/usr/bin/env bash
# Set up, give every role its own account on the local broker and database (`saga setup`,
# passwords in .secrets/), then run the coordinator and the four adapters, each connected as its
# own role, with the demo agent and the operators' console. Ctrl-C stops.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The broker and the database setup.sh found or started (scripts/services.sh).
. "${SAGA_SERVICES_DIR:-.saga/services}.env"
export SAGA_IDENTITY=roles SAGA_SECRETS_DIR="$PWD/.secrets" SAGA_PEOPLE="${SAGA_PEOPLE:-ana}"
.venv/bin/saga --log-level WARNING setup
# A console account (operator) per person, made once; the password is in .secrets/console/.
export SAGA_CONSOLE_USERS="${SAGA_CONSOLE_USERS:-$PWD/.secrets/console-users.toml}"
mkdir -p -m 700 .secrets/console
for person in ${SAGA_PEOPLE//,/ }; do
    if [ ! -f ".secrets/console/$person" ]; then
        (umask 077 && .venv/bin/saga console-user "$person" --role operator --generate \
            > ".secrets/console/$person")
    fi
done
echo "console: http://${SAGA_CONSOLE_BIND:-127.0.0.1:8080}, sign in as one of $SAGA_PEOPLE" \
    "(passwords in .secrets/console/)" >&2
exec .venv/bin/saga run all --demo "$@"
