-- Named queries of the simulated systems, loaded with saga_shared.storage.sql.Queries.

-- ---------------------------------------------------------------------------------------------
-- Idempotency (Stripe-like): the first outcome per key is stored and returned for every retry.
-- A call's own claim is in sim_call (migration 0007).

-- name: claim_key
-- Holds a key as a concurrent call would (tests hold one open to see the adapter wait).
INSERT INTO service_keys (key, system, action, order_id, outcome)
VALUES ($1, $2, $3, $4, 'pending')
ON CONFLICT (key) DO NOTHING
RETURNING key;

-- ---------------------------------------------------------------------------------------------
-- Fault injection

-- name: upsert_fault
INSERT INTO sim_faults (action, order_id, mode, remaining)
VALUES ($1, $2, $3, $4)
ON CONFLICT (action, order_id)
DO UPDATE SET mode = EXCLUDED.mode, remaining = EXCLUDED.remaining, created_at = now();

-- name: list_faults
SELECT action, order_id, mode, remaining, created_at
FROM sim_faults
ORDER BY order_id, action;

-- name: clear_faults
-- A NULL order clears every fault.
WITH cleared AS (
    DELETE FROM sim_faults
    WHERE $1::text IS NULL OR order_id = $1::text
    RETURNING 1
)
SELECT count(*) FROM cleared;

-- ---------------------------------------------------------------------------------------------
-- Effects of one order, for operators and tests

-- name: reservations_for_order
SELECT reservation_id, sku, quantity, status, created_at, released_at
FROM sim_inventory_reservations
WHERE order_id = $1
ORDER BY created_at, reservation_id;

-- name: credit_notes_for_order
SELECT credit_note_id, amount_cents, status, created_at, voided_at
FROM sim_erp_credit_notes
WHERE order_id = $1
ORDER BY created_at, credit_note_id;

-- name: charges_for_order
SELECT payment_id, amount_cents, card_token, status, refund_id, created_at, refunded_at
FROM sim_payments_charges
WHERE order_id = $1
ORDER BY created_at, payment_id;

-- name: emails_for_order
SELECT email_id, recipient, template, sent_at
FROM sim_email_messages
WHERE order_id = $1
ORDER BY sent_at, email_id;

-- name: applied_for_order
-- More than one time per key would break rule 3; listing every entity makes that visible.
SELECT action,
       idempotency_key,
       string_agg(DISTINCT entity_id, ', ') AS entity_id,
       count(*) AS times,
       min(applied_at) AS first_applied_at
FROM sim_effects
WHERE order_id = $1
GROUP BY action, idempotency_key
ORDER BY min(id);

-- name: take_fault
-- One call's injected fault, for a service of one's own, used up as the simulated systems use
-- theirs (migration 0012's key_call): 'permanent' and 'hang' fail every call, 'transient:N' and
-- 'hang:N' the next N. No row: no fault, or it is spent.
WITH f AS (
    SELECT mode, remaining FROM sim_faults WHERE action = $1 AND order_id = $2 FOR UPDATE
), spent AS (
    UPDATE sim_faults s SET remaining = s.remaining - 1
    FROM f
    WHERE s.action = $1 AND s.order_id = $2 AND f.mode <> 'permanent' AND s.remaining > 0
    RETURNING s.remaining
)
SELECT f.mode FROM f
WHERE f.mode = 'permanent' OR (f.mode = 'hang' AND f.remaining IS NULL)
   OR EXISTS (SELECT 1 FROM spent);

-- name: calls_for_order
-- What every service's adapter called for the order, as its key record holds it (services of
-- one's own included): done, failed, fenced, or still pending; whether it may have landed.
SELECT system, action, key, outcome, landed, claims, result::text AS result, error, finished_at
FROM service_keys
WHERE order_id = $1
ORDER BY created_at, key;

-- ---------------------------------------------------------------------------------------------
-- One call of a simulated system, in one statement (migration 0007)

-- name: call
-- jsonb travels as text: pools come from callers without a jsonb codec.
SELECT call_outcome, call_result::text AS call_result, call_error, call_transient
FROM sim_call($1, $2, $3, $4, $5::jsonb, $6);

-- name: call_many
-- Several calls in one statement, so one transaction and one commit: each row is a call as
-- above, $7 its position in the caller's list. A call that raises fails them all (the caller
-- then makes each alone).
SELECT c.n, r.call_outcome, r.call_result::text AS call_result, r.call_error, r.call_transient
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::int[])
    AS c(key, system, action, order_id, vals, refusal, n)
CROSS JOIN LATERAL sim_call(c.key, c.system, c.action, c.order_id, c.vals::jsonb, c.refusal) AS r;
