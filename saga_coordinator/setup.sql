-- Named queries of `saga setup`, run as a database administrator. Role and database names
-- cannot be bind parameters, so the server quotes them itself: format() with %I and %L turns
-- parameters into one safely quoted statement, which setup then runs.

-- name: role_exists
SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1);

-- name: role_create
SELECT format('CREATE ROLE %I LOGIN PASSWORD %L', $1::text, $2::text);

-- name: role_alter
SELECT format('ALTER ROLE %I LOGIN PASSWORD %L', $1::text, $2::text);

-- name: database_owner
SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = $1;

-- name: database_create
SELECT format('CREATE DATABASE %I OWNER %I', $1::text, $2::text);

-- name: database_grants
SELECT format('ALTER DATABASE %I OWNER TO %I', $1::text, $2::text)
UNION ALL
SELECT format('GRANT CONNECT ON DATABASE %I TO %I', $1::text, r)
FROM unnest($3::text[]) AS r;

-- name: schema_grants
-- The owner takes over what an earlier set-up (or a development run as superuser) created.
SELECT format('GRANT USAGE, CREATE ON SCHEMA public TO %I', $1::text)
UNION ALL
SELECT format('GRANT USAGE ON SCHEMA public TO %I', r) FROM unnest($2::text[]) AS r
UNION ALL
SELECT format('ALTER TABLE %I OWNER TO %I', tablename, $1::text) FROM pg_tables
WHERE schemaname = 'public' AND tableowner <> $1
UNION ALL
SELECT format('ALTER SEQUENCE %I OWNER TO %I', sequencename, $1::text) FROM pg_sequences
WHERE schemaname = 'public' AND sequenceowner <> $1
  AND NOT EXISTS (SELECT 1 FROM pg_depend d JOIN pg_class c ON c.oid = d.objid
                  WHERE c.relname = sequencename AND d.deptype = 'a')
UNION ALL
SELECT format('ALTER FUNCTION %I OWNER TO %I', p.proname, $1::text)
FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = 'public' AND pg_get_userbyid(p.proowner) <> $1;

-- name: grant_roles
SELECT saga_grant_roles($1), saga_grant_replies($1), saga_grant_presences($1),
       saga_grant_counts($1);

-- name: service_grants
-- A service of one's own: its own rows of the key record, its failed attempts, kept for the
-- dead letters, its requests' delivery counts; nothing of the simulated systems' tables,
-- nothing of the coordinator's.
SELECT format('SELECT saga_grant_keys(%L, %L)', $1::text, $2::text)
UNION ALL
SELECT format('GRANT SELECT, INSERT, UPDATE ON delivery_failures TO %I', $1::text)
UNION ALL
SELECT format('GRANT SELECT, INSERT, UPDATE, DELETE ON delivery_counts TO %I', $1::text)
UNION ALL
SELECT format('SELECT saga_grant_presence(%L, %L, %L)', $1::text, 'adapter', $2::text)
UNION ALL
SELECT format('GRANT SELECT, UPDATE ON sim_faults TO %I', $1::text)
UNION ALL
SELECT format('GRANT SELECT ON schema_migrations TO %I', $1::text)
UNION ALL
SELECT format('GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO %I', $1::text);
