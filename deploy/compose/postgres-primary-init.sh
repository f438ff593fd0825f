#!/usr/bin/env bash
# The primary's first start: a replication role for the standby, allowed from the network.
set -euo pipefail
psql -v ON_ERROR_STOP=1 -v password="$SAGA_REPLICATION_PASSWORD" --username "$POSTGRES_USER" <<'SQL'
CREATE ROLE replicator WITH REPLICATION LOGIN PASSWORD :'password';
SQL
echo "host replication replicator all scram-sha-256" >> "$PGDATA/pg_hba.conf"
