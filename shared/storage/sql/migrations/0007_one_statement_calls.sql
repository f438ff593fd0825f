-- A call of a simulated system in ONE statement (one round trip, its own transaction) instead
-- of nine (begin, claim, fault, savepoint, two inserts, release, store, commit). The system's
-- Python side decides everything that needs no database first (parameters, new ids, refusals);
-- sim_call does the rest: claim the idempotency key, apply an injected fault, run the action,
-- store the outcome. Semantics are those of services/simulated.py before this migration.
-- Functions run with the caller's rights: an adapter's role still touches only its own tables.

CREATE OR REPLACE FUNCTION sim_effect(p_action text, p_order text, p_key text, p_entity text,
                                      p_detail jsonb) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO sim_effects (system, action, order_id, idempotency_key, entity_id, detail)
    VALUES (split_part(p_action, '.', 1), p_action, p_order, p_key, p_entity, p_detail);
$$;

-- The entity a compensation undoes: the id it was given, or the one its forward action's
-- stored outcome names. NULL when the forward action certainly did not land; when it never
-- ran, its key is stored as failed, so a late forward request cannot land after this (a fence).
CREATE OR REPLACE FUNCTION sim_target(p_action text, p_order text, p_key text, v jsonb,
                                      p_forward text, p_id_field text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    forward_key text := v ->> 'forward_key';
    fenced text;
    stored record;
BEGIN
    IF v ->> p_id_field IS NOT NULL THEN
        RETURN v ->> p_id_field;
    END IF;
    INSERT INTO sim_idempotency (key, system, action, order_id, outcome, error)
    VALUES (forward_key, split_part(p_forward, '.', 1), p_forward, p_order, 'failed',
            format('not run: %s (%s) compensated it first', p_action, p_key))
    ON CONFLICT (key) DO NOTHING
    RETURNING key INTO fenced;
    IF fenced IS NOT NULL THEN
        RETURN NULL;
    END IF;
    SELECT s.action, s.order_id, s.outcome, s.result INTO stored
    FROM sim_idempotency s WHERE s.key = forward_key;
    IF NOT FOUND OR stored.outcome <> 'done' THEN
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

-- Lock the target row and return its status; NULL when it does not exist. Undoing another
-- order's entity would be a silent disaster: refused loudly.
CREATE OR REPLACE FUNCTION sim_status(p_action text, p_order text, p_table text, p_id_column text,
                                      p_id text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    owner text;
    found_status text;
BEGIN
    IF p_id IS NULL THEN
        RETURN NULL;
    END IF;
    EXECUTE format('SELECT order_id, status FROM %I WHERE %I = $1 FOR UPDATE', p_table, p_id_column)
    INTO owner, found_status USING p_id;
    IF owner IS NOT NULL AND owner <> p_order THEN
        RAISE EXCEPTION '%: % belongs to order %, not %', p_action, p_id, owner, p_order;
    END IF;
    RETURN found_status;
END $$;

-- The action itself, on values the Python side checked; its result. RAISE: a refusal.
CREATE OR REPLACE FUNCTION sim_apply(p_action text, p_order text, p_key text, v jsonb)
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    target text;
    found_status text;
BEGIN
    CASE p_action
    WHEN 'inventory.reserve_stock' THEN
        INSERT INTO sim_inventory_reservations (reservation_id, order_id, sku, quantity, status)
        VALUES (v ->> 'reservation_id', p_order, v ->> 'sku', (v ->> 'quantity')::integer,
                'reserved');
        PERFORM sim_effect(p_action, p_order, p_key, v ->> 'reservation_id',
                           jsonb_build_object('sku', v -> 'sku', 'quantity', v -> 'quantity'));
        RETURN jsonb_build_object('reservation_id', v ->> 'reservation_id');
    WHEN 'inventory.release_stock' THEN
        target := sim_target(p_action, p_order, p_key, v, 'inventory.reserve_stock',
                             'reservation_id');
        found_status := sim_status(p_action, p_order, 'sim_inventory_reservations',
                                   'reservation_id', target);
        IF target IS NULL OR found_status IS DISTINCT FROM 'reserved' THEN
            RETURN jsonb_build_object('released', false, 'reservation_id', target);
        END IF;
        UPDATE sim_inventory_reservations SET status = 'released', released_at = now()
        WHERE reservation_id = target;
        PERFORM sim_effect(p_action, p_order, p_key, target, '{}');
        RETURN jsonb_build_object('released', true, 'reservation_id', target);
    WHEN 'erp.create_credit_note' THEN
        INSERT INTO sim_erp_credit_notes (credit_note_id, order_id, amount_cents, status)
        VALUES (v ->> 'credit_note_id', p_order, (v ->> 'amount_cents')::integer, 'issued');
        PERFORM sim_effect(p_action, p_order, p_key, v ->> 'credit_note_id',
                           jsonb_build_object('amount_cents', v -> 'amount_cents'));
        RETURN jsonb_build_object('credit_note_id', v ->> 'credit_note_id');
    WHEN 'erp.void_credit_note' THEN
        target := sim_target(p_action, p_order, p_key, v, 'erp.create_credit_note',
                             'credit_note_id');
        found_status := sim_status(p_action, p_order, 'sim_erp_credit_notes', 'credit_note_id',
                                   target);
        IF target IS NULL OR found_status IS DISTINCT FROM 'issued' THEN
            RETURN jsonb_build_object('voided', false, 'credit_note_id', target);
        END IF;
        UPDATE sim_erp_credit_notes SET status = 'voided', voided_at = now()
        WHERE credit_note_id = target;
        PERFORM sim_effect(p_action, p_order, p_key, target, '{}');
        RETURN jsonb_build_object('voided', true, 'credit_note_id', target);
    WHEN 'erp.validate_address' THEN  -- read-only: the Python side computed the answer
        RETURN v;
    WHEN 'payments.charge_card' THEN
        INSERT INTO sim_payments_charges (payment_id, order_id, amount_cents, card_token, status)
        VALUES (v ->> 'payment_id', p_order, (v ->> 'amount_cents')::integer,
                v ->> 'card_token', 'charged');
        PERFORM sim_effect(p_action, p_order, p_key, v ->> 'payment_id',
                           jsonb_build_object('amount_cents', v -> 'amount_cents'));
        RETURN jsonb_build_object('payment_id', v ->> 'payment_id');
    WHEN 'payments.refund_charge' THEN
        target := sim_target(p_action, p_order, p_key, v, 'payments.charge_card', 'payment_id');
        found_status := sim_status(p_action, p_order, 'sim_payments_charges', 'payment_id',
                                   target);
        IF target IS NULL OR found_status IS DISTINCT FROM 'charged' THEN
            RETURN jsonb_build_object('refunded', false, 'payment_id', target, 'refund_id', NULL);
        END IF;
        UPDATE sim_payments_charges
        SET status = 'refunded', refund_id = v ->> 'refund_id', refunded_at = now()
        WHERE payment_id = target;
        PERFORM sim_effect(p_action, p_order, p_key, target,
                           jsonb_build_object('refund_id', v -> 'refund_id'));
        RETURN jsonb_build_object('refunded', true, 'payment_id', target,
                                  'refund_id', v ->> 'refund_id');
    WHEN 'email.send_customer_email', 'email.send_confirmation' THEN
        INSERT INTO sim_email_messages (email_id, order_id, recipient, template)
        VALUES (v ->> 'email_id', p_order, v ->> 'recipient', v ->> 'template');
        PERFORM sim_effect(p_action, p_order, p_key, v ->> 'email_id',
                           jsonb_build_object('template', v -> 'template'));
        RETURN jsonb_build_object('email_id', v ->> 'email_id');
    ELSE
        RAISE EXCEPTION '% has no SQL in sim_apply', p_action;
    END CASE;
END $$;

-- One call: the outcome to report. call_transient: nothing landed and nothing was stored (an
-- injected transient fault), so a retry runs the call for real.
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
    SELECT f.mode INTO fault FROM sim_faults f
    WHERE f.action = p_action AND f.order_id = p_order FOR UPDATE;
    IF FOUND AND fault.mode = 'permanent' THEN
        reason := format('injected permanent fault on %s', p_action);
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
