-- Named queries of the simulated systems, loaded with shared.sql.Queries.

-- ---------------------------------------------------------------------------------------------
-- Idempotency (Stripe-like): the first outcome per key is stored and returned for every retry.

-- name: claim_key
-- Waits on a concurrent transaction holding the same key, so "nothing inserted" means a final row.
INSERT INTO sim_idempotency (key, system, action, order_id, outcome)
VALUES ($1, $2, $3, $4, 'pending')
ON CONFLICT (key) DO NOTHING
RETURNING key;

-- name: claim_key_as_failed
-- Used by a compensation to fence off a forward action that never ran.
INSERT INTO sim_idempotency (key, system, action, order_id, outcome, error)
VALUES ($1, $2, $3, $4, 'failed', $5)
ON CONFLICT (key) DO NOTHING
RETURNING key;

-- name: stored_outcome
SELECT action, order_id, outcome, result, error
FROM sim_idempotency
WHERE key = $1;

-- name: store_outcome
UPDATE sim_idempotency
SET outcome = $2, result = $3::jsonb, error = $4
WHERE key = $1;

-- name: release_key
DELETE FROM sim_idempotency
WHERE key = $1 AND outcome = 'pending';

-- name: insert_effect
INSERT INTO sim_effects (system, action, order_id, idempotency_key, entity_id, detail)
VALUES ($1, $2, $3, $4, $5, $6::jsonb);

-- ---------------------------------------------------------------------------------------------
-- Fault injection

-- name: lock_fault
SELECT mode, remaining
FROM sim_faults
WHERE action = $1 AND order_id = $2
FOR UPDATE;

-- name: consume_fault
UPDATE sim_faults
SET remaining = remaining - 1
WHERE action = $1 AND order_id = $2 AND remaining > 0
RETURNING remaining;

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
-- Inventory

-- name: insert_reservation
INSERT INTO sim_inventory_reservations (reservation_id, order_id, sku, quantity, status)
VALUES ($1, $2, $3, $4, 'reserved');

-- name: lock_reservation
SELECT order_id, status
FROM sim_inventory_reservations
WHERE reservation_id = $1
FOR UPDATE;

-- name: release_reservation
UPDATE sim_inventory_reservations
SET status = 'released', released_at = now()
WHERE reservation_id = $1;

-- ---------------------------------------------------------------------------------------------
-- ERP

-- name: insert_credit_note
INSERT INTO sim_erp_credit_notes (credit_note_id, order_id, amount_cents, status)
VALUES ($1, $2, $3, 'issued');

-- name: lock_credit_note
SELECT order_id, status
FROM sim_erp_credit_notes
WHERE credit_note_id = $1
FOR UPDATE;

-- name: void_credit_note
UPDATE sim_erp_credit_notes
SET status = 'voided', voided_at = now()
WHERE credit_note_id = $1;

-- ---------------------------------------------------------------------------------------------
-- Payments

-- name: insert_charge
INSERT INTO sim_payments_charges (payment_id, order_id, amount_cents, card_token, status)
VALUES ($1, $2, $3, $4, 'charged');

-- name: lock_charge
SELECT order_id, status
FROM sim_payments_charges
WHERE payment_id = $1
FOR UPDATE;

-- name: refund_charge
UPDATE sim_payments_charges
SET status = 'refunded', refund_id = $2, refunded_at = now()
WHERE payment_id = $1;

-- ---------------------------------------------------------------------------------------------
-- E-mail

-- name: insert_email
INSERT INTO sim_email_messages (email_id, order_id, recipient, template)
VALUES ($1, $2, $3, $4);

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
