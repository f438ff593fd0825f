-- Named queries shared by every consumer: recording failed attempts and blocking orders.

-- name: failure_upsert
INSERT INTO delivery_failures (message_id, order_id, queue, last_error) VALUES ($1, $2, $3, $4)
ON CONFLICT (message_id, queue) DO UPDATE
SET attempts = delivery_failures.attempts + 1, last_error = EXCLUDED.last_error, last_at = now();

-- name: block_upsert
-- A block keeps the arrival number it took when its message first failed.
INSERT INTO order_blocks (order_id, message_id, state, reason) VALUES ($1, $2, $3, $4)
ON CONFLICT (order_id, message_id)
DO UPDATE SET state = EXCLUDED.state, reason = EXCLUDED.reason, updated_at = now()
RETURNING arrival;
