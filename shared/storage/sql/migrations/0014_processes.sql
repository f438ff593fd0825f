-- Which processes run and what each is doing: every coordinator and adapter writes its own row
-- every few seconds (saga_shared.storage.presence); the console's health page and the
-- coordinator's gauges read them. Beats are stamped with the database's clock, so one clock
-- decides who has gone silent, whatever the hosts' clocks say.
CREATE TABLE processes (
    id          text PRIMARY KEY,
    namespace   text NOT NULL,
    kind        text NOT NULL CHECK (kind IN ('coordinator', 'adapter')),
    name        text NOT NULL,
    host        text NOT NULL,
    pid         integer NOT NULL,
    version     text NOT NULL,
    started_at  timestamptz NOT NULL DEFAULT now(),
    beat_at     timestamptz NOT NULL DEFAULT now(),
    stopped_at  timestamptz,
    -- Deliveries so far per queue, at this beat and at the one before: rates are the
    -- difference, without a time series store.
    queues      jsonb NOT NULL DEFAULT '{}',
    before      jsonb NOT NULL DEFAULT '{}',
    before_at   timestamptz
);

CREATE INDEX processes_namespace_idx ON processes (namespace, kind, name);

-- A component writes only its own kind's and name's rows: an adapter cannot make another
-- service look alive. The coordinator also sees, marks and forgets every row (its gauges).
ALTER TABLE processes ENABLE ROW LEVEL SECURITY;

CREATE OR REPLACE FUNCTION saga_grant_presence(role text, kind text, name text) RETURNS void
LANGUAGE plpgsql AS $fn$
BEGIN
    EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON processes TO %I', role);
    EXECUTE format('DROP POLICY IF EXISTS %I ON processes', 'presence_of_' || role);
    -- The coordinator reads every row and marks a replaced one stopped (its gauges).
    EXECUTE format('CREATE POLICY %I ON processes TO %I USING (%s) WITH CHECK (%s)',
                   'presence_of_' || role, role,
                   CASE WHEN kind = 'coordinator' THEN 'true'
                        ELSE format('kind = %L AND name = %L', kind, name) END,
                   CASE WHEN kind = 'coordinator' THEN 'true'
                        ELSE format('kind = %L AND name = %L', kind, name) END);
END
$fn$;

CREATE OR REPLACE FUNCTION saga_grant_presences(prefix text) RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    service text;
    t text;
BEGIN
    PERFORM saga_grant_presence(prefix || 'coordinator', 'coordinator', 'coordinator');
    FOREACH service IN ARRAY ARRAY['inventory', 'erp', 'payments', 'email'] LOOP
        PERFORM saga_grant_presence(prefix || service, 'adapter', service);
    END LOOP;
    FOREACH t IN ARRAY ARRAY['reader', 'operator'] LOOP
        EXECUTE format('DROP POLICY IF EXISTS %I ON processes', 'presence_read_by_' || prefix || t);
        EXECUTE format('CREATE POLICY %I ON processes FOR SELECT TO %I USING (true)',
                       'presence_read_by_' || prefix || t, prefix || t);
    END LOOP;
END
$fn$;
