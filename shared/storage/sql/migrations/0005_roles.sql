-- Postgres roles: one per component, each with the narrowest grants. `saga setup` creates the
-- roles (it needs a superuser or CREATEROLE) and calls this function after migrating; it is
-- idempotent, so it runs again after every upgrade. Role names are the deployment's prefix and
-- the component: saga_coordinator, saga_inventory, ..., saga_reader, saga_operator.

CREATE OR REPLACE FUNCTION saga_grant_roles(prefix text) RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    coordinator_tables text[] := ARRAY['sagas', 'inbox', 'outbox', 'saga_log', 'rejections',
        'orders', 'order_blocks', 'parked', 'intake_seqs', 'command_seqs', 'delivery_failures',
        'dead_letters', 'dlq_audit', 'deadlines'];
    service_tables jsonb := '{"inventory": "sim_inventory_reservations",
        "erp": "sim_erp_credit_notes", "payments": "sim_payments_charges",
        "email": "sim_email_messages"}';
    service text;
    t text;
BEGIN
    -- The coordinator: its own tables, nothing of the systems it drives.
    FOREACH t IN ARRAY coordinator_tables LOOP
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON %I TO %I', t,
                       prefix || 'coordinator');
    END LOOP;
    EXECUTE format('GRANT SELECT ON schema_migrations TO %I', prefix || 'coordinator');
    -- Each service: its own system's table, the systems' shared idempotency, fault and effect
    -- tables, and its failed attempts (for the dead letters).
    FOR service IN SELECT jsonb_object_keys(service_tables) LOOP
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON %I TO %I',
                       service_tables ->> service, prefix || service);
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON sim_idempotency, sim_faults TO %I',
                       prefix || service);
        EXECUTE format('GRANT SELECT, INSERT ON sim_effects TO %I', prefix || service);
        EXECUTE format('GRANT SELECT, INSERT, UPDATE ON delivery_failures TO %I',
                       prefix || service);
        EXECUTE format('GRANT SELECT ON schema_migrations TO %I', prefix || service);
        EXECUTE format('GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO %I', prefix || service);
    END LOOP;
    -- Reading (the CLI, the console): everything, changing nothing.
    EXECUTE format('GRANT SELECT ON ALL TABLES IN SCHEMA public TO %I', prefix || 'reader');
    -- Acting from the CLI: fault injection only; every other action is a command on the broker.
    EXECUTE format('GRANT SELECT ON ALL TABLES IN SCHEMA public TO %I', prefix || 'operator');
    EXECUTE format('GRANT INSERT, UPDATE, DELETE ON sim_faults TO %I', prefix || 'operator');
    EXECUTE format('GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO %I', prefix || 'coordinator');
END
$fn$;
