-- What the console reads. Everything here is a read: the console changes state only by sending
-- the same commands the CLI sends.

-- name: sagas_page
-- Newest first; $6/$7 continue after the last row of the page before (keyset paging).
SELECT saga_id, order_id, saga, status, state->>'waiting_for' AS waiting_for,
       state->>'reason' AS reason, created_at, updated_at
FROM sagas
WHERE ($1::text IS NULL OR status = $1)
  AND ($2::text IS NULL OR saga = $2)
  AND ($3::text IS NULL OR order_id = $3)
  AND ($4::timestamptz IS NULL OR created_at >= $4)
  AND ($5::timestamptz IS NULL OR created_at < $5)
  AND ($6::timestamptz IS NULL OR (created_at, saga_id) < ($6, $7::text))
ORDER BY created_at DESC, saga_id DESC
LIMIT $8;

-- name: status_counts
SELECT status, count(*) AS n FROM sagas GROUP BY status;

-- name: people_queue
-- Sagas that wait for a person, oldest first: the longest wait is the first to see.
SELECT state::text AS state, updated_at FROM sagas
WHERE status IN ('needs_human', 'awaiting_approval')
ORDER BY updated_at, saga_id
LIMIT $1;

-- name: dead_by_reason
SELECT reason, count(*) AS n, count(DISTINCT order_id) AS orders, min(created_at) AS first_at,
       max(updated_at) AS last_at
FROM dead_letters WHERE status = 'dead'
GROUP BY reason ORDER BY n DESC, reason;

-- name: dead_by_order
SELECT coalesce(order_id, '') AS order_id, count(*) AS n, bool_or(blocks_order) AS blocks,
       min(created_at) AS first_at,
       (SELECT count(*) FROM parked p WHERE p.order_id = d.order_id) AS parked
FROM dead_letters d WHERE status = 'dead'
GROUP BY d.order_id ORDER BY min(created_at), order_id
LIMIT $1;

-- name: processes
-- Every coordinator and adapter of this namespace that beat lately (saga_shared.storage.presence),
-- with the seconds since its last beat by the database's clock (the one that stamped it).
SELECT id, kind, name, host, pid, version, started_at, beat_at, stopped_at, queues::text AS queues,
       before::text AS before, before_at, extract(epoch FROM now() - beat_at) AS quiet_s,
       partitions
FROM processes WHERE namespace = $1
ORDER BY kind, name, started_at;

-- name: deadline_of
-- What the saga waits for next, and until when: an answer (then a resend), a gate, a settle.
SELECT step, phase, attempt, due_at, extract(epoch FROM due_at - now()) AS in_s
FROM deadlines WHERE saga_id = $1;

-- name: dead_by_error
-- The dead letters by the type of the error that killed them, as the failure recorder wrote
-- it ("ValueError: ..."); a letter with no recorded error is counted under "".
SELECT coalesce(substring(error FROM '^([A-Za-z_][A-Za-z0-9_.]*): '), '') AS error_type,
       count(*) AS n, count(DISTINCT order_id) AS orders, max(updated_at) AS last_at
FROM dead_letters WHERE status = 'dead'
GROUP BY 1 ORDER BY n DESC, 1;

-- name: abortable
-- The sagas of a filtered list an abort can stop (running, waiting for their order, awaiting
-- approval), oldest first; $6 caps them.
SELECT saga_id, order_id FROM sagas
WHERE status IN ('running', 'waiting', 'awaiting_approval')
  AND ($1::text IS NULL OR status = $1)
  AND ($2::text IS NULL OR saga = $2)
  AND ($3::text IS NULL OR order_id = $3)
  AND ($4::timestamptz IS NULL OR created_at >= $4)
  AND ($5::timestamptz IS NULL OR created_at < $5)
ORDER BY created_at, saga_id
LIMIT $6;

-- name: dead_ids
-- The dead letters a replay of an order's, or of a reason's, would republish.
SELECT id FROM dead_letters
WHERE status = 'dead' AND ($1::text IS NULL OR order_id = $1)
  AND ($2::text IS NULL OR reason = $2)
ORDER BY id;
