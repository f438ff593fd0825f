-- A third kind of injected fault: ``hang`` (every call) or ``hang:N`` (the next N calls) never
-- answers. sim_call says so ('hang'); the simulated system then waits until the adapter's
-- timeout gives up on the call, with nothing landed and nothing kept under the key.

ALTER TABLE sim_faults DROP CONSTRAINT sim_faults_mode_check;
ALTER TABLE sim_faults ADD CONSTRAINT sim_faults_mode_check
    CHECK (mode IN ('permanent', 'transient', 'hang'));

-- The call of migration 0007, with the hang.
CREATE OR REPLACE FUNCTION sim_call(p_key text, p_system text, p_action text, p_order text,
                                    p_values jsonb, p_refusal text)
RETURNS TABLE (call_outcome text, call_result jsonb, call_error text, call_transient boolean)
LANGUAGE plpgsql AS $$
DECLARE
    claimed text;
    stored record;
    fault record;
    left_over integer;
    verdict text := 'failed';
    answer jsonb;
    reason text := p_refusal;
BEGIN
    -- Waits on a concurrent call holding the key, so "nothing inserted" means a final row.
    INSERT INTO sim_idempotency (key, system, action, order_id, outcome)
    VALUES (p_key, p_system, p_action, p_order, 'pending')
    ON CONFLICT (key) DO NOTHING
    RETURNING key INTO claimed;
    IF claimed IS NULL THEN
        SELECT s.action, s.order_id, s.outcome, s.result, s.error INTO stored
        FROM sim_idempotency s WHERE s.key = p_key;
        IF NOT FOUND THEN
            RETURN QUERY SELECT NULL::text, NULL::jsonb,
                format('idempotency key %s vanished; retry', quote_literal(p_key)), true;
        -- Stripe refuses a key reused with other parameters; reusing one for another action
        -- or order is the same mistake, and returning the other call's result would hide it.
        ELSIF stored.action <> p_action OR stored.order_id <> p_order THEN
            RETURN QUERY SELECT 'failed'::text, NULL::jsonb,
                format('idempotency key %s was first used for %s on order %s',
                       quote_literal(p_key), stored.action, stored.order_id), false;
        ELSIF stored.outcome = 'done' THEN
            RETURN QUERY SELECT 'done'::text, coalesce(stored.result, '{}'::jsonb),
                NULL::text, false;
        ELSE
            RETURN QUERY SELECT 'failed'::text, NULL::jsonb, coalesce(stored.error, 'failed'),
                false;
        END IF;
        RETURN;
    END IF;
    SELECT f.mode, f.remaining INTO fault FROM sim_faults f
    WHERE f.action = p_action AND f.order_id = p_order FOR UPDATE;
    IF FOUND AND fault.mode = 'permanent' THEN
        reason := format('injected permanent fault on %s', p_action);
    ELSIF FOUND AND fault.mode = 'hang' THEN
        UPDATE sim_faults f SET remaining = f.remaining - 1
        WHERE f.action = p_action AND f.order_id = p_order AND f.remaining > 0
        RETURNING f.remaining INTO left_over;
        IF left_over IS NOT NULL OR fault.remaining IS NULL THEN
            -- Nothing lands and nothing is kept: the caller waits for an answer that never
            -- comes, until its own timeout.
            DELETE FROM sim_idempotency s WHERE s.key = p_key AND s.outcome = 'pending';
            RETURN QUERY SELECT 'hang'::text, NULL::jsonb,
                format('injected hang on %s', p_action), true;
            RETURN;
        END IF;
    ELSIF FOUND THEN
        UPDATE sim_faults f SET remaining = f.remaining - 1
        WHERE f.action = p_action AND f.order_id = p_order AND f.remaining > 0
        RETURNING f.remaining INTO left_over;
        IF left_over IS NOT NULL THEN  -- the fault is consumed; the key is not kept
            DELETE FROM sim_idempotency s WHERE s.key = p_key AND s.outcome = 'pending';
            RETURN QUERY SELECT NULL::text, NULL::jsonb,
                format('injected transient fault on %s (%s more to come)', p_action, left_over),
                true;
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
                -- A value this system cannot take: nothing landed, and a retry would be
                -- refused again.
                reason := format('%s refused a value: %s', p_system, left(SQLERRM, 500));
        END;
    END IF;
    UPDATE sim_idempotency s SET outcome = verdict, result = answer, error = reason
    WHERE s.key = p_key;
    RETURN QUERY SELECT verdict, answer, reason, false;
END $$;
