-- Every service's key record: the adapter SDK claims a key (owner, lease, attempt) before each
-- call and stores its outcome after; a settle answers from it, fencing a key nobody claimed.
-- The simulated systems keep their idempotency in the same table and write it in the same
-- transaction as their effects (sim_call), so for them the SDK's record and the system's are
-- one row: they cannot disagree. It was sim_idempotency.

ALTER TABLE sim_idempotency RENAME TO service_keys;
ALTER INDEX sim_idempotency_pkey RENAME TO service_keys_pkey;
ALTER INDEX sim_idempotency_order_idx RENAME TO service_keys_order_idx;
ALTER TABLE service_keys DROP CONSTRAINT sim_idempotency_outcome_check;
ALTER TABLE service_keys
    ADD COLUMN owner text,                      -- the adapter process holding the claim
    ADD COLUMN lease_until timestamptz,         -- nobody fences a live claim before this
    ADD COLUMN send integer NOT NULL DEFAULT 0, -- the coordinator's send it belongs to
    ADD COLUMN attempt integer NOT NULL DEFAULT 0,  -- calls of that send, raised by each claim
    ADD COLUMN claims integer NOT NULL DEFAULT 0,   -- calls of every send: only ever raised
    ADD COLUMN landed boolean NOT NULL DEFAULT false,  -- a try may have landed
    ADD COLUMN finished_at timestamptz;
-- fenced: never claimed (or abandoned where that is safe) and refused to every later call.
UPDATE service_keys SET outcome = 'fenced' WHERE outcome = 'failed' AND error LIKE 'not run: %';
ALTER TABLE service_keys ADD CONSTRAINT service_keys_outcome_check
    CHECK (outcome IN ('pending', 'done', 'failed', 'fenced'));

-- The claims of one batch, in one statement. Per key: 'call' (claimed: attempt n of this send),
-- 'done' / 'failed' / 'fenced' (stored: no call), 'busy' (another live process holds it, where
-- the effect is not atomic with this row: that one will answer, this one must not call), or
-- 'spent' (this send's attempts are used up, crashes and re-runs included). p_atomic: the
-- service's effect commits with this row, so an unfinished claim landed nothing and may be
-- taken over.
CREATE OR REPLACE FUNCTION key_claim(p_service text, p_owner text, p_atomic boolean,
                                     p_keys text[], p_actions text[], p_orders text[],
                                     p_sends integer[], p_limits integer[], p_lease float8[])
RETURNS TABLE (n integer, verdict text, attempt integer, result jsonb, error text,
               landed boolean, owner text, lease_left float8)
LANGUAGE plpgsql AS $$
DECLARE
    i integer;
    row service_keys%ROWTYPE;
    next_attempt integer;
BEGIN
    IF p_atomic THEN
        -- Where the effect commits with the key's row, a claim needs no flush of its own: a
        -- call that lands commits after it (flushing it too), and a claim lost in a crash was
        -- a try that landed nothing. One fsync fewer per batch.
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    FOR i IN 1 .. coalesce(array_length(p_keys, 1), 0) LOOP
        INSERT INTO service_keys (key, system, action, order_id, outcome, owner, lease_until,
                                  send, attempt, claims)
        VALUES (p_keys[i], p_service, p_actions[i], p_orders[i], 'pending', p_owner,
                now() + make_interval(secs => p_lease[i]), p_sends[i], 1, 1)
        ON CONFLICT (key) DO NOTHING;
        IF FOUND THEN
            RETURN QUERY SELECT i, 'call'::text, 1, NULL::jsonb, NULL::text, false, p_owner,
                p_lease[i];
            CONTINUE;
        END IF;
        SELECT * INTO row FROM service_keys s WHERE s.key = p_keys[i] FOR UPDATE;
        IF NOT FOUND THEN  -- another service's row (row level security hides it)
            RETURN QUERY SELECT i, 'failed'::text, 0, NULL::jsonb,
                format('idempotency key %s is another service''s', quote_literal(p_keys[i])),
                false, NULL::text, NULL::float8;
        ELSIF row.action <> p_actions[i] OR row.order_id <> p_orders[i] THEN
            RETURN QUERY SELECT i, 'failed'::text, row.attempt, NULL::jsonb,
                format('idempotency key %s was first used for %s on order %s',
                       quote_literal(p_keys[i]), row.action, row.order_id), false, row.owner,
                NULL::float8;
        ELSIF row.outcome <> 'pending' THEN
            RETURN QUERY SELECT i, row.outcome, row.attempt, row.result, row.error, row.landed,
                row.owner, NULL::float8;
        ELSIF NOT p_atomic AND row.owner IS NOT NULL AND row.owner <> p_owner THEN
            RETURN QUERY SELECT i, 'busy'::text, row.attempt, NULL::jsonb, NULL::text,
                row.landed, row.owner,
                greatest(extract(epoch FROM row.lease_until - now()), 0)::float8;
        ELSE
            next_attempt := CASE WHEN row.send = p_sends[i] THEN row.attempt + 1 ELSE 1 END;
            IF row.send > p_sends[i] OR next_attempt > p_limits[i] THEN
                RETURN QUERY SELECT i, 'spent'::text, row.attempt, NULL::jsonb, NULL::text,
                    row.landed, row.owner, NULL::float8;
            ELSE
                UPDATE service_keys s SET owner = p_owner, send = p_sends[i],
                    attempt = next_attempt, claims = s.claims + 1,
                    lease_until = now() + make_interval(secs => p_lease[i])
                WHERE s.key = p_keys[i];
                RETURN QUERY SELECT i, 'call'::text, next_attempt, NULL::jsonb, NULL::text,
                    row.landed, p_owner, p_lease[i];
            END IF;
        END IF;
    END LOOP;
END $$;

-- What a settle finds, fencing a key nobody claimed: 'fenced' (fenced_now: by this call),
-- 'done' / 'failed', or for a claim not finished 'running' (its lease is live) or 'expired';
-- with claims, how many calls have claimed the key so far. Where the effect is atomic with the
-- row (p_atomic) an unfinished claim landed nothing and is fenced at once: 'fenced'. Nothing
-- ever writes a claim over a fence.
CREATE OR REPLACE FUNCTION key_settle(p_key text, p_service text, p_action text, p_order text,
                                      p_atomic boolean)
RETURNS TABLE (verdict text, result jsonb, error text, landed boolean, owner text,
               lease_left float8, fenced_now boolean, claims integer)
LANGUAGE plpgsql AS $$
DECLARE
    row service_keys%ROWTYPE;
BEGIN
    INSERT INTO service_keys (key, system, action, order_id, outcome, error, finished_at)
    VALUES (p_key, p_service, p_action, p_order, 'fenced',
            'fenced by a settle before any call claimed it', now())
    ON CONFLICT (key) DO NOTHING;
    IF FOUND THEN
        RETURN QUERY SELECT 'fenced'::text, NULL::jsonb,
            'fenced by a settle before any call claimed it'::text, false, NULL::text,
            NULL::float8, true, 0;
        RETURN;
    END IF;
    SELECT * INTO row FROM service_keys s WHERE s.key = p_key FOR UPDATE;
    IF NOT FOUND OR row.action <> p_action OR row.order_id <> p_order THEN
        RETURN QUERY SELECT 'expired'::text, NULL::jsonb,
            format('key %s belongs to %s on order %s', quote_literal(p_key), row.action,
                   row.order_id), row.landed, row.owner, NULL::float8, false, row.claims;
    ELSIF row.outcome <> 'pending' THEN
        RETURN QUERY SELECT row.outcome, row.result, row.error, row.landed, row.owner,
            NULL::float8, false, row.claims;
    ELSIF p_atomic THEN
        UPDATE service_keys s SET outcome = 'fenced', finished_at = now(),
            error = format('fenced by a settle: claimed by %s, never finished, so nothing '
                           'landed', coalesce(row.owner, 'a call'))
        WHERE s.key = p_key
        RETURNING s.error INTO row.error;
        RETURN QUERY SELECT 'fenced'::text, NULL::jsonb, row.error, false, row.owner,
            NULL::float8, true, row.claims;
    ELSIF row.lease_until > now() THEN
        RETURN QUERY SELECT 'running'::text, NULL::jsonb, NULL::text, row.landed, row.owner,
            extract(epoch FROM row.lease_until - now())::float8, false, row.claims;
    ELSE
        RETURN QUERY SELECT 'expired'::text, NULL::jsonb, row.error, row.landed, row.owner,
            extract(epoch FROM now() - coalesce(row.lease_until, row.created_at))::float8,
            false, row.claims;
    END IF;
END $$;

-- A claim left unfinished whose lease has expired, fenced (a person said it did not happen, or
-- a compensation is about to undo it); then what the key holds, as key_settle says it.
-- p_claims: fence only if no call has claimed the key since that many claims (a person's word
-- covers the calls they knew of, never one made after); NULL: whatever the count.
CREATE OR REPLACE FUNCTION key_fence(p_key text, p_service text, p_action text, p_order text,
                                     p_reason text, p_claims integer)
RETURNS TABLE (verdict text, result jsonb, error text, landed boolean, owner text,
               lease_left float8, fenced_now boolean, claims integer)
LANGUAGE plpgsql AS $$
DECLARE
    was_landed boolean;
    was_owner text;
    was_claims integer;
BEGIN
    UPDATE service_keys s SET outcome = 'fenced', error = p_reason, finished_at = now()
    WHERE s.key = p_key AND s.outcome = 'pending' AND s.lease_until <= now()
        AND (p_claims IS NULL OR s.claims <= p_claims)
    RETURNING s.landed, s.owner, s.claims INTO was_landed, was_owner, was_claims;
    IF FOUND THEN
        RETURN QUERY SELECT 'fenced'::text, NULL::jsonb, p_reason, was_landed, was_owner,
            NULL::float8, true, was_claims;
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM key_settle(p_key, p_service, p_action, p_order, false);
END $$;

-- The simulated systems' compensation target (migration 0007), reading the renamed record: a
-- forward key never claimed, or claimed and never finished (nothing landed: the record is
-- atomic with the effect), is fenced, so a late forward request cannot land after this.
CREATE OR REPLACE FUNCTION sim_target(p_action text, p_order text, p_key text, v jsonb,
                                      p_forward text, p_id_field text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    forward_key text := v ->> 'forward_key';
    fence_text text := format('not run: %s (%s) compensated it first', p_action, p_key);
    stored record;
BEGIN
    IF v ->> p_id_field IS NOT NULL THEN
        RETURN v ->> p_id_field;
    END IF;
    INSERT INTO service_keys (key, system, action, order_id, outcome, error, finished_at)
    VALUES (forward_key, split_part(p_forward, '.', 1), p_forward, p_order, 'fenced', fence_text,
            now())
    ON CONFLICT (key) DO NOTHING;
    IF FOUND THEN
        RETURN NULL;
    END IF;
    SELECT s.action, s.order_id, s.outcome, s.result INTO stored
    FROM service_keys s WHERE s.key = forward_key FOR UPDATE;
    IF stored.outcome = 'pending' THEN
        UPDATE service_keys s SET outcome = 'fenced', error = fence_text, finished_at = now()
        WHERE s.key = forward_key;
        RETURN NULL;
    END IF;
    IF stored.outcome <> 'done' THEN
        RETURN NULL;
    END IF;
    IF stored.action <> p_forward OR stored.order_id <> p_order THEN
        RAISE EXCEPTION '%: forward_key % belongs to % on order %, not % on %', p_action,
            quote_literal(forward_key), stored.action, stored.order_id, p_forward, p_order;
    END IF;
    IF jsonb_typeof(stored.result -> p_id_field) IS DISTINCT FROM 'string' THEN
        RAISE EXCEPTION '%: the stored result of % has no %', p_action,
            quote_literal(forward_key), p_id_field;
    END IF;
    RETURN stored.result ->> p_id_field;
END $$;

-- One call of a simulated system (migrations 0007 and 0010), on the renamed record: the
-- adapter has usually claimed the key already (a pending row); a row that is final (done,
-- failed, or fenced by a settle or a compensation) is answered from, never run again. The row
-- lock serialises the call with a concurrent settle, so a fence and an effect never both win.
CREATE OR REPLACE FUNCTION sim_call(p_key text, p_system text, p_action text, p_order text,
                                    p_values jsonb, p_refusal text)
RETURNS TABLE (call_outcome text, call_result jsonb, call_error text, call_transient boolean)
LANGUAGE plpgsql AS $$
DECLARE
    stored record;
    fault record;
    left_over integer;
    verdict text := 'failed';
    answer jsonb;
    reason text := p_refusal;
BEGIN
    INSERT INTO service_keys (key, system, action, order_id, outcome)
    VALUES (p_key, p_system, p_action, p_order, 'pending')
    ON CONFLICT (key) DO NOTHING;
    SELECT s.action, s.order_id, s.outcome, s.result, s.error INTO stored
    FROM service_keys s WHERE s.key = p_key FOR UPDATE;
    IF NOT FOUND THEN  -- another service's key (row level security hides it): never run it
        RETURN QUERY SELECT 'failed'::text, NULL::jsonb,
            format('idempotency key %s is another service''s', quote_literal(p_key)), false;
        RETURN;
    END IF;
    -- Stripe refuses a key reused with other parameters; reusing one for another action or
    -- order is the same mistake, and returning the other call's result would hide it.
    IF stored.action <> p_action OR stored.order_id <> p_order THEN
        RETURN QUERY SELECT 'failed'::text, NULL::jsonb,
            format('idempotency key %s was first used for %s on order %s',
                   quote_literal(p_key), stored.action, stored.order_id), false;
        RETURN;
    ELSIF stored.outcome = 'done' THEN
        RETURN QUERY SELECT 'done'::text, coalesce(stored.result, '{}'::jsonb), NULL::text, false;
        RETURN;
    ELSIF stored.outcome <> 'pending' THEN
        RETURN QUERY SELECT 'failed'::text, NULL::jsonb,
            coalesce(stored.error, stored.outcome), false;
        RETURN;
    END IF;
    SELECT f.mode, f.remaining INTO fault FROM sim_faults f
    WHERE f.action = p_action AND f.order_id = p_order FOR UPDATE;
    IF FOUND AND fault.mode = 'permanent' THEN
        reason := format('injected permanent fault on %s', p_action);
    ELSIF FOUND THEN
        UPDATE sim_faults f SET remaining = f.remaining - 1
        WHERE f.action = p_action AND f.order_id = p_order AND f.remaining > 0
        RETURNING f.remaining INTO left_over;
        IF left_over IS NOT NULL OR (fault.mode = 'hang' AND fault.remaining IS NULL) THEN
            -- Nothing lands; the claim stays unfinished, so a settle may fence it.
            RETURN QUERY SELECT CASE WHEN fault.mode = 'hang' THEN 'hang' END, NULL::jsonb,
                CASE WHEN fault.mode = 'hang' THEN format('injected hang on %s', p_action)
                     ELSE format('injected transient fault on %s (%s more to come)', p_action,
                                 left_over) END, true;
            RETURN;
        END IF;
    END IF;
    IF reason IS NULL THEN
        -- A block with an exception handler is a subtransaction: an action refusing half-way
        -- leaves none of its writes, while the claim survives to store the refusal.
        BEGIN
            answer := sim_apply(p_action, p_order, p_key, p_values);
            verdict := 'done';
        EXCEPTION
            WHEN raise_exception THEN
                reason := SQLERRM;
            WHEN data_exception THEN
                reason := format('%s refused a value: %s', p_system, left(SQLERRM, 500));
        END;
    END IF;
    UPDATE service_keys s SET outcome = verdict, result = answer, error = reason,
        finished_at = now()
    WHERE s.key = p_key;
    RETURN QUERY SELECT verdict, answer, reason, false;
END $$;

-- Each service sees and writes its own keys only: the table is shared, its rows are not.
ALTER TABLE service_keys ENABLE ROW LEVEL SECURITY;

-- The policy that gives one service role its own rows of the key record (idempotent).
CREATE OR REPLACE FUNCTION saga_grant_keys(role text, service text) RETURNS void
LANGUAGE plpgsql AS $fn$
BEGIN
    EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON service_keys TO %I', role);
    EXECUTE format('DROP POLICY IF EXISTS %I ON service_keys', 'keys_of_' || role);
    EXECUTE format('CREATE POLICY %I ON service_keys TO %I USING (system = %L) '
                   'WITH CHECK (system = %L)', 'keys_of_' || role, role, service, service);
END
$fn$;

-- Roles (migration 0005), on the renamed record.
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
    FOREACH t IN ARRAY coordinator_tables LOOP
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON %I TO %I', t,
                       prefix || 'coordinator');
    END LOOP;
    EXECUTE format('GRANT SELECT ON schema_migrations TO %I', prefix || 'coordinator');
    -- Each service: its own system's table, the key record, the fault and effect tables, and
    -- its failed attempts (for the dead letters).
    FOR service IN SELECT jsonb_object_keys(service_tables) LOOP
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON %I TO %I',
                       service_tables ->> service, prefix || service);
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON sim_faults TO %I',
                       prefix || service);
        PERFORM saga_grant_keys(prefix || service, service);
        EXECUTE format('GRANT SELECT, INSERT ON sim_effects TO %I', prefix || service);
        EXECUTE format('GRANT SELECT, INSERT, UPDATE ON delivery_failures TO %I',
                       prefix || service);
        EXECUTE format('GRANT SELECT ON schema_migrations TO %I', prefix || service);
        EXECUTE format('GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO %I', prefix || service);
    END LOOP;
    EXECUTE format('GRANT SELECT ON ALL TABLES IN SCHEMA public TO %I', prefix || 'reader');
    EXECUTE format('GRANT SELECT ON ALL TABLES IN SCHEMA public TO %I', prefix || 'operator');
    FOREACH t IN ARRAY ARRAY['reader', 'operator'] LOOP  -- they read every service's keys
        EXECUTE format('DROP POLICY IF EXISTS %I ON service_keys', 'keys_read_by_' || prefix || t);
        EXECUTE format('CREATE POLICY %I ON service_keys FOR SELECT TO %I USING (true)',
                       'keys_read_by_' || prefix || t, prefix || t);
    END LOOP;
    EXECUTE format('GRANT INSERT, UPDATE, DELETE ON sim_faults TO %I', prefix || 'operator');
    EXECUTE format('GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO %I', prefix || 'coordinator');
END
$fn$;

-- The deadline of a settle (saga_coordinator.doubt).
ALTER TABLE deadlines DROP CONSTRAINT deadlines_phase_check;
ALTER TABLE deadlines ADD CONSTRAINT deadlines_phase_check
    CHECK (phase IN ('forward', 'compensation', 'gate', 'settle'));
