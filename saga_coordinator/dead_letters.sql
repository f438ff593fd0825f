-- Named queries for dead letters and the operators' audit trail.

-- name: dl_lock
SELECT id, message_id, message_type, order_id, saga_id, source_queue, exchange, routing_key,
       reason, error, delivery_count, body, status, sender, blocks_order, block_key, arrival
FROM dead_letters WHERE id = $1 FOR UPDATE;

-- name: dl_insert
-- A delivery already stored (its ingester died before the ack) returns to its row; a replayed or
-- discarded message that died again goes back to 'dead', the earlier death kept in its history.
INSERT INTO dead_letters (message_id, message_type, order_id, saga_id, source_queue, exchange,
    routing_key, reason, error, delivery_count, first_failed_at, last_failed_at, headers, body,
    sender, transport_id, blocks_order, block_key, body_bytes, status)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13::jsonb, $14::bytea, $15, $16, $17, $18,
        octet_length($14::bytea), 'dead')
ON CONFLICT (message_id, (coalesce(source_queue, '')), (coalesce(sender, ''))) DO UPDATE
SET history = CASE WHEN dead_letters.status = 'dead' THEN dead_letters.history
        ELSE dead_letters.history || jsonb_build_array(jsonb_build_object(
            'reason', dead_letters.reason, 'error', dead_letters.error,
            'delivery_count', dead_letters.delivery_count,
            'first_failed_at', dead_letters.first_failed_at,
            'last_failed_at', dead_letters.last_failed_at, 'status', dead_letters.status)) END,
    times_dead = dead_letters.times_dead + CASE WHEN dead_letters.status = 'dead' THEN 0 ELSE 1 END,
    status = 'dead', reason = EXCLUDED.reason, error = EXCLUDED.error,
    delivery_count = EXCLUDED.delivery_count, last_failed_at = EXCLUDED.last_failed_at,
    headers = EXCLUDED.headers, updated_at = now()
RETURNING id;

-- name: dl_dead_again
-- A replayed message that failed again: back to 'dead' in its own row, the earlier death kept in
-- its history (a second delivery of the same death changes nothing more).
UPDATE dead_letters
SET history = CASE WHEN status = 'replayed' THEN history || jsonb_build_array(jsonb_build_object(
        'reason', reason, 'error', error, 'delivery_count', delivery_count,
        'first_failed_at', first_failed_at, 'last_failed_at', last_failed_at, 'status', status))
        ELSE history END,
    times_dead = times_dead + CASE WHEN status = 'replayed' THEN 1 ELSE 0 END,
    status = 'dead', reason = $3, error = $4, delivery_count = $5,
    first_failed_at = $6, last_failed_at = $7, headers = $8::jsonb, updated_at = now()
WHERE id = $1 AND message_id = $2 AND status IN ('replayed', 'dead')
RETURNING id;

-- name: dl_set_arrival
UPDATE dead_letters SET arrival = $2 WHERE id = $1;

-- name: dl_original_sender
-- Who first sent a dead letter that is being replayed ($3: also one already dead again).
SELECT sender FROM dead_letters
WHERE id = $1 AND message_id = $2 AND (status = 'replayed' OR ($3 AND status = 'dead'));

-- name: dl_set_status
UPDATE dead_letters SET status = $2, updated_at = now() WHERE id = $1;

-- name: dl_get
SELECT * FROM dead_letters WHERE id = $1;

-- name: dl_list
SELECT id, message_id, message_type, order_id, saga_id, source_queue, reason, error, sender,
       blocks_order, delivery_count, times_dead, status, created_at, updated_at
FROM dead_letters
WHERE ($1::text IS NULL OR order_id = $1)
  AND ($2::text IS NULL OR reason = $2)
  AND ($3::timestamptz IS NULL OR updated_at >= $3)
  AND ($4::text IS NULL OR status = $4)
ORDER BY id LIMIT $5;

-- name: dl_ids_dead
-- In each order's arrival order, which is its publish order, whichever ingester stored them.
SELECT id FROM dead_letters
WHERE status = 'dead' AND ($1::text IS NULL OR order_id = $1)
  AND ($2::text IS NULL OR reason = $2)
ORDER BY order_id NULLS LAST, arrival NULLS LAST, id;

-- name: failure_get
SELECT attempts, last_error, first_at, last_at FROM delivery_failures
WHERE message_id = $1 AND queue = $2;

-- name: failure_delete
-- A replayed message starts afresh: its failures and its deliveries (a request queue's count).
WITH counts AS (DELETE FROM delivery_counts WHERE message_id = $1)
DELETE FROM delivery_failures WHERE message_id = $1;

-- name: seq_of_message
SELECT seq FROM command_seqs WHERE message_id = $1;

-- name: tombstone_insert
-- A discarded command that will never arrive: its number is skipped when the drain reaches it.
INSERT INTO parked (order_id, message_id, message_type, seq, reason, body)
VALUES ($1, $2, 'convoy.skip', $3, $4, ''::bytea)
ON CONFLICT (message_id) DO NOTHING;

-- name: audit_insert
INSERT INTO dlq_audit (dead_letter_id, action, actor, actor_role, note)
VALUES ($1, $2, $3, $4, $5);

-- name: audit_for
SELECT action, actor, actor_role, note, at FROM dlq_audit WHERE dead_letter_id = $1 ORDER BY id;

-- name: deadline_rearm
-- A discarded deadline message: the timer fires again, so the saga cannot hang (rule 1).
INSERT INTO deadlines (saga_id, order_id, step, phase, idempotency_key, attempt, due_at)
VALUES ($1, $2, $3, $4, $5, $6, now())
ON CONFLICT (saga_id) DO NOTHING;
