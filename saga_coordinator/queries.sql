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
INSERT INTO saga_log (saga_id, order_id, message_id, message_type, note)
VALUES ($1, $2, $3, $4, $5);

-- name: outbox_insert
INSERT INTO outbox (exchange, routing_key, message_id, message_type, order_id, body)
VALUES ($1, $2, $3, $4, $5, $6);

-- name: outbox_notify
SELECT pg_notify('saga_outbox', '');

-- name: outbox_lock
SELECT pg_try_advisory_xact_lock($1);

-- name: outbox_batch
SELECT id, exchange, routing_key, message_id, message_type, order_id, body
FROM outbox ORDER BY id LIMIT $1;

-- name: outbox_delete
DELETE FROM outbox WHERE id = ANY($1::bigint[]);

-- name: outbox_pending
SELECT count(*) FROM outbox;

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
SELECT state::text FROM sagas WHERE order_id = $1 ORDER BY created_at, saga_id;

-- name: saga_list
SELECT saga_id, order_id, saga, status, created_at, updated_at
FROM sagas
WHERE ($1::text IS NULL OR status = $1) AND ($2::text IS NULL OR order_id = $2)
ORDER BY created_at DESC, saga_id LIMIT $3;

-- name: saga_order_of
SELECT order_id FROM sagas WHERE saga_id = $1;

-- name: log_for_saga
SELECT message_id, message_type, note, handled_at FROM saga_log WHERE saga_id = $1 ORDER BY id;
