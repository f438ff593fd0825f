-- Named queries for dead letters and the operators' audit trail.

-- name: dl_lock_by_message
SELECT id FROM dead_letters WHERE message_id = $1 FOR UPDATE;

-- name: dl_lock
SELECT id, message_id, message_type, order_id, saga_id, source_queue, exchange, routing_key,
       reason, error, delivery_count, body, status
FROM dead_letters WHERE id = $1 FOR UPDATE;

-- name: dl_insert
INSERT INTO dead_letters (message_id, message_type, order_id, saga_id, source_queue, exchange,
    routing_key, reason, error, delivery_count, first_failed_at, last_failed_at, headers, body,
    status)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13::jsonb, $14, 'dead')
RETURNING id;

-- name: dl_dead_again
-- A replayed message that failed again: back to 'dead', the earlier death kept in its history.
UPDATE dead_letters
SET history = history || jsonb_build_array(jsonb_build_object(
        'reason', reason, 'error', error, 'delivery_count', delivery_count,
        'first_failed_at', first_failed_at, 'last_failed_at', last_failed_at, 'status', status)),
    status = 'dead', times_dead = times_dead + 1, reason = $2, error = $3, delivery_count = $4,
    first_failed_at = $5, last_failed_at = $6, headers = $7::jsonb, updated_at = now()
WHERE id = $1
RETURNING true;

-- name: dl_set_status
UPDATE dead_letters SET status = $2, updated_at = now() WHERE id = $1;

-- name: dl_get
SELECT * FROM dead_letters WHERE id = $1;

-- name: dl_list
SELECT id, message_id, message_type, order_id, saga_id, source_queue, reason, error,
       delivery_count, times_dead, status, created_at, updated_at
FROM dead_letters
WHERE ($1::text IS NULL OR order_id = $1)
  AND ($2::text IS NULL OR reason = $2)
  AND ($3::timestamptz IS NULL OR updated_at >= $3)
  AND ($4::text IS NULL OR status = $4)
ORDER BY id LIMIT $5;

-- name: dl_ids_dead
SELECT id FROM dead_letters
WHERE status = 'dead' AND ($1::text IS NULL OR order_id = $1)
ORDER BY order_id NULLS LAST, id;

-- name: failure_get
SELECT attempts, last_error, first_at, last_at FROM delivery_failures WHERE message_id = $1;

-- name: failure_delete
DELETE FROM delivery_failures WHERE message_id = $1;

-- name: seq_of_message
SELECT seq FROM command_seqs WHERE message_id = $1;

-- name: tombstone_insert
-- A discarded command that will never arrive: its number is skipped when the drain reaches it.
INSERT INTO parked (order_id, message_id, message_type, seq, reason, body)
VALUES ($1, $2, 'convoy.skip', $3, $4, ''::bytea)
ON CONFLICT (message_id) DO NOTHING;

-- name: audit_insert
INSERT INTO dlq_audit (dead_letter_id, action, actor, note) VALUES ($1, $2, $3, $4);

-- name: audit_for
SELECT action, actor, note, at FROM dlq_audit WHERE dead_letter_id = $1 ORDER BY id;
