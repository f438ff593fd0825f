-- Named queries of the coordinator. Loaded by shared.sql.Queries.

-- name: inbox_insert
INSERT INTO inbox (message_id, saga_id) VALUES ($1, $2)
ON CONFLICT (message_id) DO NOTHING
RETURNING true;

-- name: saga_lock
SELECT state::text FROM sagas WHERE saga_id = $1 FOR UPDATE;

-- name: saga_insert
INSERT INTO sagas (saga_id, order_id, saga, status, state, created_at, updated_at)
VALUES ($1, $2, $3, $4, $5::jsonb, $6, $6);

-- name: saga_update
UPDATE sagas SET status = $2, state = $3::jsonb, updated_at = $4 WHERE saga_id = $1;

-- name: log_insert
INSERT INTO saga_log (saga_id, order_id, message_id, message_type, note, seq)
VALUES ($1, $2, $3, $4, $5, $6);

-- name: outbox_insert
INSERT INTO outbox (exchange, routing_key, message_id, message_type, order_id, body, headers)
VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb);

-- name: outbox_notify
SELECT pg_notify('saga_outbox', '');

-- name: outbox_lock
SELECT pg_try_advisory_xact_lock($1);

-- name: outbox_batch
SELECT id, exchange, routing_key, message_id, message_type, order_id, body, headers::text
FROM outbox ORDER BY id LIMIT $1;

-- name: outbox_delete
DELETE FROM outbox WHERE id = ANY($1::bigint[]);

-- name: rejection_insert
INSERT INTO rejections (message_id, saga_id, order_id, command_type, rule, reason, body)
VALUES ($1, $2, $3, $4, $5, $6, $7);

-- name: rejection_list
SELECT id, message_id, saga_id, order_id, command_type, rule, reason, rejected_at
FROM rejections
WHERE ($1::text IS NULL OR order_id = $1)
ORDER BY id DESC LIMIT $2;

-- name: saga_get
SELECT state::text FROM sagas WHERE saga_id = $1;

-- name: saga_by_order
SELECT state::text FROM sagas WHERE order_id = $1 ORDER BY arrival;

-- name: saga_list
SELECT saga_id, order_id, saga, status, state->>'waiting_for' AS waiting_for, created_at, updated_at
FROM sagas
WHERE ($1::text IS NULL OR status = $1) AND ($2::text IS NULL OR order_id = $2)
ORDER BY created_at DESC, saga_id LIMIT $3;

-- name: saga_order_of
SELECT order_id FROM sagas WHERE saga_id = $1;

-- name: log_for_saga
SELECT seq, message_id, message_type, note, handled_at FROM saga_log WHERE saga_id = $1 ORDER BY id;

-- name: order_lock
-- Creates the order's row on first sight and locks it: every message of one order is handled
-- under this lock, so two consumers can never interleave one order.
INSERT INTO orders (order_id) VALUES ($1)
ON CONFLICT (order_id) DO UPDATE SET order_id = EXCLUDED.order_id
RETURNING active_saga_id, next_seq, handled,
    (SELECT coalesce(jsonb_agg(jsonb_build_object('message_id', b.message_id, 'state', b.state)
                               ORDER BY b.created_at, b.message_id), '[]'::jsonb)
     FROM order_blocks b WHERE b.order_id = $1)::text AS blocks,
    EXISTS (SELECT 1 FROM parked p WHERE p.order_id = $1) AS has_parked;

-- name: order_save
UPDATE orders SET active_saga_id = $2, next_seq = $3, handled = $4, updated_at = now()
WHERE order_id = $1;

-- name: order_get
SELECT order_id, active_saga_id, next_seq, handled, updated_at FROM orders WHERE order_id = $1;

-- name: block_delete
DELETE FROM order_blocks WHERE order_id = $1 AND message_id = $2;

-- name: blocks_for_order
SELECT message_id, state, reason, created_at FROM order_blocks WHERE order_id = $1
ORDER BY created_at, message_id;

-- name: blocked_orders
SELECT b.order_id, b.message_id, b.state, b.reason, b.created_at,
       (SELECT count(*) FROM parked p WHERE p.order_id = b.order_id) AS parked
FROM order_blocks b ORDER BY b.created_at, b.order_id LIMIT $1;

-- name: park_insert
INSERT INTO parked (order_id, message_id, message_type, seq, reason, body)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (message_id) DO NOTHING;

-- name: parked_for_order
SELECT id, message_id, message_type, seq, reason, body, parked_at FROM parked
WHERE order_id = $1 ORDER BY id;

-- name: parked_delete
DELETE FROM parked WHERE id = $1;

-- name: waiting_next
SELECT state::text FROM sagas WHERE order_id = $1 AND status = 'waiting'
ORDER BY arrival LIMIT 1 FOR UPDATE;

-- name: seq_existing
SELECT seq FROM command_seqs WHERE message_id = $1;

-- name: seq_next
INSERT INTO intake_seqs (order_id, last_seq) VALUES ($1, 1)
ON CONFLICT (order_id) DO UPDATE SET last_seq = intake_seqs.last_seq + 1
RETURNING last_seq;

-- name: seq_record
INSERT INTO command_seqs (message_id, order_id, seq) VALUES ($1, $2, $3);

-- name: deadline_arm
INSERT INTO deadlines (saga_id, order_id, step, phase, idempotency_key, attempt, due_at)
VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT (saga_id) DO UPDATE
SET step = EXCLUDED.step, phase = EXCLUDED.phase, idempotency_key = EXCLUDED.idempotency_key,
    attempt = EXCLUDED.attempt, due_at = EXCLUDED.due_at;

-- name: deadline_disarm
DELETE FROM deadlines WHERE saga_id = $1;

-- name: deadlines_due
SELECT saga_id, order_id, step, phase, idempotency_key, attempt FROM deadlines
WHERE due_at <= now() ORDER BY due_at LIMIT $1 FOR UPDATE SKIP LOCKED;

-- name: waiting_for_update
UPDATE sagas SET state = jsonb_set(state, '{waiting_for}', to_jsonb($2::text))
WHERE order_id = $1 AND status = 'waiting';
