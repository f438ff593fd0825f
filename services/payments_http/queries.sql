-- Named queries of the HTTP payments service (services/payments_http/api.py).

-- name: claim
-- The first request per key inserts the row; a concurrent one waits here for its commit and
-- then finds the stored response.
INSERT INTO payapi_requests (key, fingerprint, status, body)
VALUES ($1, $2, 0, '')
ON CONFLICT (key) DO NOTHING
RETURNING key;

-- name: stored
SELECT fingerprint, status, body FROM payapi_requests WHERE key = $1;

-- name: answer
UPDATE payapi_requests SET status = $2, body = $3 WHERE key = $1;

-- name: charge
INSERT INTO payapi_charges (id, idempotency_key, order_id, amount_cents, card_token)
VALUES ($1, $2, $3, $4, $5);

-- name: charge_by_id
SELECT id, amount_cents, refund_id FROM payapi_charges WHERE id = $1 FOR UPDATE;

-- name: charge_by_key
SELECT id, amount_cents, refund_id FROM payapi_charges WHERE idempotency_key = $1 FOR UPDATE;

-- name: refund
UPDATE payapi_charges SET refund_id = $2, refunded_at = now() WHERE id = $1 AND refund_id IS NULL;

-- name: charges_for_order
SELECT id, idempotency_key, amount_cents, card_token, refund_id, created_at, refunded_at
FROM payapi_charges WHERE order_id = $1 ORDER BY created_at, id;
