-- Named queries of the coordinator. Loaded by saga_shared.storage.sql.Queries.

-- The hot path is two statements per message: `claim` reads under the locks, `write_batch` writes
-- everything the decision produced. Each statement is a network round trip and a parse and plan
-- on the server; one message used to cost ten.

-- name: claim
-- For each message of a batch (at most one per order): its inbox row (absent for a duplicate),
-- then its order's row, created on first sight and locked, in order_id order so that two
-- batches never wait for each other in a circle; every message of one order is handled under
-- this lock, so two consumers can never interleave one order. The saga row is locked after;
-- its register comes only when its row version (xmin) differs from the one the caller holds
-- ($4, '' for none: see saga_coordinator.cache).
WITH input AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]) WITH ORDINALITY
        AS i (order_id, message_id, saga_id, known, n)
), fresh AS (
    INSERT INTO inbox (message_id, saga_id) SELECT message_id, saga_id FROM input
    ON CONFLICT (message_id) DO NOTHING
    RETURNING message_id
), locked AS (
    INSERT INTO orders (order_id) SELECT order_id FROM input ORDER BY order_id
    ON CONFLICT (order_id) DO UPDATE SET order_id = EXCLUDED.order_id
    RETURNING order_id, active_saga_id, next_seq, handled
)
SELECT l.order_id, l.active_saga_id, l.next_seq, l.handled,
    (SELECT coalesce(jsonb_agg(jsonb_build_object('message_id', b.message_id, 'state', b.state)
                               ORDER BY b.arrival), '[]'::jsonb)
     FROM order_blocks b WHERE b.order_id = i.order_id)::text AS blocks,
    EXISTS (SELECT 1 FROM parked p WHERE p.order_id = i.order_id) AS has_parked,
    EXISTS (SELECT 1 FROM sagas w WHERE w.order_id = i.order_id AND w.status = 'waiting')
        AS has_waiting,
    EXISTS (SELECT 1 FROM fresh f WHERE f.message_id = i.message_id) AS fresh,
    s.version, s.saga
FROM input i JOIN locked l ON l.order_id = i.order_id
LEFT JOIN LATERAL (
    SELECT xmin::text AS version,
           CASE WHEN xmin::text = i.known THEN NULL ELSE state::text END AS saga
    FROM sagas WHERE saga_id = i.saga_id FOR UPDATE
) s ON true
ORDER BY i.n;

-- name: write_batch
-- Everything one transaction decided, as arrays, in one statement. A saga or a deadline appears
-- at most once (the last write wins in the caller); a NULL due_at disarms the saga's deadline.
-- The orders' `= ANY`: see apply_batch.
WITH saved AS (
    INSERT INTO sagas (saga_id, order_id, saga, status, state, created_at, updated_at)
    SELECT s.saga_id, s.order_id, s.saga, s.status, s.state::jsonb, $6, $6
    FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[])
        AS s (saga_id, order_id, saga, status, state)
    ON CONFLICT (saga_id) DO UPDATE
    SET status = EXCLUDED.status, state = EXCLUDED.state, updated_at = EXCLUDED.updated_at
    -- A saga id another order took meanwhile is never written over: the guard below aborts
    -- the statement, and the transaction runs again and finds it (saga_coordinator.store).
    WHERE sagas.order_id = EXCLUDED.order_id
    RETURNING saga_id, xmin::text AS version
), armed AS (
    INSERT INTO deadlines (saga_id, order_id, step, phase, idempotency_key, attempt, due_at)
    SELECT d.* FROM unnest($7::text[], $8::text[], $9::int[], $10::text[], $11::text[],
                           $12::int[], $13::timestamptz[])
        AS d (saga_id, order_id, step, phase, idempotency_key, attempt, due_at)
    WHERE d.due_at IS NOT NULL
    ON CONFLICT (saga_id) DO UPDATE
    SET step = EXCLUDED.step, phase = EXCLUDED.phase, idempotency_key = EXCLUDED.idempotency_key,
        attempt = EXCLUDED.attempt, due_at = EXCLUDED.due_at
), disarmed AS (
    DELETE FROM deadlines
    WHERE saga_id IN (SELECT d.saga_id FROM unnest($7::text[], $13::timestamptz[]) AS d (saga_id, due_at)
                      WHERE d.due_at IS NULL)
), sent AS (
    -- WITH ORDINALITY: the relay publishes in id order, so ids follow the list's order.
    INSERT INTO outbox (exchange, routing_key, message_id, message_type, order_id, body, headers,
                        direct)
    SELECT o.exchange, o.routing_key, o.message_id, o.message_type, o.order_id, o.body,
           o.headers::jsonb, $31
    FROM unnest($14::text[], $15::text[], $16::text[], $17::text[], $18::text[], $19::bytea[],
                $20::text[]) WITH ORDINALITY
        AS o (exchange, routing_key, message_id, message_type, order_id, body, headers, n)
    ORDER BY o.n
    RETURNING id
), published AS (
    -- rows an earlier transaction of this process published since: gone with this statement
    DELETE FROM outbox WHERE id = ANY($32::bigint[])
), remembered AS (
    -- the answers given to the commands handled, for a command sent again under its id
    INSERT INTO command_replies (message_id, body)
    SELECT * FROM unnest($33::text[], $34::bytea[])
    ON CONFLICT (message_id) DO UPDATE SET body = EXCLUDED.body
), logged AS (
    INSERT INTO saga_log (saga_id, order_id, message_id, message_type, note, seq)
    SELECT l.saga_id, l.order_id, l.message_id, l.message_type, l.note, l.seq
    FROM unnest($21::text[], $22::text[], $23::text[], $24::text[], $25::text[],
                           $26::bigint[]) WITH ORDINALITY
        AS l (saga_id, order_id, message_id, message_type, note, seq, n)
    ORDER BY l.n
), ordered AS (
    UPDATE orders o SET active_saga_id = v.active_saga_id, next_seq = v.next_seq,
                        handled = v.handled, updated_at = now()
    FROM unnest($27::text[], $28::text[], $29::bigint[], $30::bigint[])
        AS v (order_id, active_saga_id, next_seq, handled)
    WHERE o.order_id = ANY($27::text[]) AND o.order_id = v.order_id
    RETURNING o.order_id, o.xmin::text AS version
)
-- The ids of the rows written, in the list's order (ids grow with it); the sagas' and the
-- orders' new row versions, in theirs; and, for rows the relay publishes, its wake-up,
-- delivered at commit, so it never sees a row before it is visible.
SELECT saga_guard((SELECT count(*) FROM saved) = cardinality($1::text[])) AS held,
       (SELECT coalesce(array_agg(id ORDER BY id), '{}') FROM sent) AS ids,
       (SELECT coalesce(array_agg(v.version ORDER BY s.n), '{}')
        FROM saved v JOIN unnest($1::text[]) WITH ORDINALITY AS s (saga_id, n)
            ON s.saga_id = v.saga_id) AS versions,
       (SELECT coalesce(array_agg(v.version ORDER BY s.n), '{}')
        FROM ordered v JOIN unnest($27::text[]) WITH ORDINALITY AS s (order_id, n)
            ON s.order_id = v.order_id) AS order_versions,
       (SELECT pg_notify('saga_outbox', '') WHERE cardinality($14::text[]) > 0 AND NOT $31)
           AS woken;

-- name: apply_batch
-- The whole transaction of a group in one statement, without a claim: the decision was made on
-- what this process committed last (saga_coordinator.cache), and the statement holds the
-- database to it: each message new to the inbox, each order's and saga's row still at the
-- version the decision read ($5, $11, $18; NULL: the row must not exist yet), no block, no
-- parked message, and waiting sagas where the decision expected them. These are what `claim`
-- would have read, under the same locks (the UPDATEs take them). If any differs, saga_guard
-- raises and nothing of the statement stays. The writes are write_batch's, with the orders'
-- and sagas' rows updated at the version read.
-- Each join of a table with the batch's arrays also names its keys as `= ANY(...)`: the generic
-- plan (SAGA_DB_PLAN_CACHE_MODE), made once per session, then looks the rows up by key however
-- few rows the tables held when it was made; joined on the arrays alone it scanned them whole.
WITH fresh AS (
    INSERT INTO inbox (message_id, saga_id) SELECT * FROM unnest($1::text[], $2::text[])
    ON CONFLICT (message_id) DO NOTHING
    RETURNING message_id
), held AS (
    SELECT * FROM unnest($3::text[], $4::text[], $5::text[], $6::bigint[], $7::bigint[],
                         $8::boolean[])
        AS h (order_id, version, active_saga_id, next_seq, handled, has_waiting)
), moved AS (
    UPDATE orders o SET active_saga_id = h.active_saga_id, next_seq = h.next_seq,
                        handled = h.handled, updated_at = now()
    FROM held h WHERE o.order_id = ANY($3::text[]) AND o.order_id = h.order_id
        AND o.xmin::text = h.version
    RETURNING o.order_id, o.xmin::text AS version
), created AS (
    INSERT INTO orders (order_id, active_saga_id, next_seq, handled)
    SELECT h.order_id, h.active_saga_id, h.next_seq, h.handled FROM held h WHERE h.version IS NULL
    ON CONFLICT (order_id) DO NOTHING
    RETURNING order_id, xmin::text AS version
), unchanged AS (
    SELECT s.saga_id FROM sagas s
    JOIN unnest($9::text[], $10::text[]) AS r (saga_id, version)
        ON s.saga_id = r.saga_id AND s.xmin::text = r.version
    WHERE s.saga_id = ANY($9::text[])
    FOR UPDATE OF s
), written AS (
    SELECT * FROM unnest($11::text[], $12::text[], $13::text[], $14::text[], $15::text[],
                         $16::text[]) WITH ORDINALITY
        AS w (saga_id, version, order_id, saga, status, state, n)
), saved AS (
    UPDATE sagas s SET status = w.status, state = w.state::jsonb, updated_at = $17
    FROM written w WHERE s.saga_id = ANY($11::text[]) AND s.saga_id = w.saga_id
        AND s.xmin::text = w.version
    RETURNING s.saga_id, s.xmin::text AS version
), born AS (
    INSERT INTO sagas (saga_id, order_id, saga, status, state, created_at, updated_at)
    SELECT w.saga_id, w.order_id, w.saga, w.status, w.state::jsonb, $17, $17
    FROM written w WHERE w.version IS NULL
    ON CONFLICT (saga_id) DO NOTHING
    RETURNING saga_id, xmin::text AS version
), armed AS (
    INSERT INTO deadlines (saga_id, order_id, step, phase, idempotency_key, attempt, due_at)
    SELECT d.* FROM unnest($18::text[], $19::text[], $20::int[], $21::text[], $22::text[],
                           $23::int[], $24::timestamptz[])
        AS d (saga_id, order_id, step, phase, idempotency_key, attempt, due_at)
    WHERE d.due_at IS NOT NULL
    ON CONFLICT (saga_id) DO UPDATE
    SET step = EXCLUDED.step, phase = EXCLUDED.phase, idempotency_key = EXCLUDED.idempotency_key,
        attempt = EXCLUDED.attempt, due_at = EXCLUDED.due_at
), disarmed AS (
    DELETE FROM deadlines
    WHERE saga_id IN (SELECT d.saga_id FROM unnest($18::text[], $24::timestamptz[]) AS d (saga_id, due_at)
                      WHERE d.due_at IS NULL)
), sent AS (
    INSERT INTO outbox (exchange, routing_key, message_id, message_type, order_id, body, headers,
                        direct)
    SELECT o.exchange, o.routing_key, o.message_id, o.message_type, o.order_id, o.body,
           o.headers::jsonb, true
    FROM unnest($25::text[], $26::text[], $27::text[], $28::text[], $29::text[], $30::bytea[],
                $31::text[]) WITH ORDINALITY
        AS o (exchange, routing_key, message_id, message_type, order_id, body, headers, n)
    ORDER BY o.n
    RETURNING id
), published AS (
    DELETE FROM outbox WHERE id = ANY($38::bigint[])
), remembered AS (
    INSERT INTO command_replies (message_id, body)
    SELECT * FROM unnest($39::text[], $40::bytea[])
    ON CONFLICT (message_id) DO UPDATE SET body = EXCLUDED.body
), logged AS (
    INSERT INTO saga_log (saga_id, order_id, message_id, message_type, note, seq)
    SELECT l.saga_id, l.order_id, l.message_id, l.message_type, l.note, l.seq
    FROM unnest($32::text[], $33::text[], $34::text[], $35::text[], $36::text[],
                           $37::bigint[]) WITH ORDINALITY
        AS l (saga_id, order_id, message_id, message_type, note, seq, n)
    ORDER BY l.n
)
SELECT saga_guard(
           (SELECT count(*) FROM fresh) = cardinality($1::text[])
           AND (SELECT count(*) FROM moved) + (SELECT count(*) FROM created)
               = cardinality($3::text[])
           AND (SELECT count(*) FROM unchanged) = cardinality($9::text[])
           AND (SELECT count(*) FROM saved) + (SELECT count(*) FROM born)
               = cardinality($11::text[])
           AND NOT EXISTS (SELECT 1 FROM order_blocks b WHERE b.order_id = ANY($3::text[]))
           AND NOT EXISTS (SELECT 1 FROM parked p WHERE p.order_id = ANY($3::text[]))
           AND NOT EXISTS (SELECT 1 FROM held h WHERE h.has_waiting IS DISTINCT FROM EXISTS (
               SELECT 1 FROM sagas w WHERE w.order_id = h.order_id AND w.status = 'waiting'))
       ) AS held,
       (SELECT coalesce(array_agg(id ORDER BY id), '{}') FROM sent) AS ids,
       (SELECT coalesce(array_agg(v.version ORDER BY w.n), '{}')
        FROM (SELECT * FROM saved UNION ALL SELECT * FROM born) v
        JOIN written w ON w.saga_id = v.saga_id) AS versions,
       (SELECT coalesce(array_agg(v.version ORDER BY h.n), '{}')
        FROM (SELECT * FROM moved UNION ALL SELECT * FROM created) v
        JOIN unnest($3::text[]) WITH ORDINALITY AS h (order_id, n) ON h.order_id = v.order_id)
           AS order_versions;

-- name: seq_assign
-- The order's next command number, or the one this message already got (a redelivery).
WITH existing AS (
    SELECT seq FROM command_seqs WHERE message_id = $1
), next AS (
    INSERT INTO intake_seqs (order_id, last_seq)
    SELECT $2, 1 WHERE NOT EXISTS (SELECT 1 FROM existing)
    ON CONFLICT (order_id) DO UPDATE SET last_seq = intake_seqs.last_seq + 1
    RETURNING last_seq
), recorded AS (
    INSERT INTO command_seqs (message_id, order_id, seq) SELECT $1, $2, last_seq FROM next
)
SELECT seq FROM existing UNION ALL SELECT last_seq FROM next;

-- name: saga_lock
SELECT state::text FROM sagas WHERE saga_id = $1 FOR UPDATE;

-- name: stored_reply
SELECT body FROM command_replies WHERE message_id = $1;

-- name: inbox_has
SELECT EXISTS (SELECT 1 FROM inbox WHERE message_id = $1);

-- name: relay_lead
-- Session-scoped: the relay keeps it until its connection ends.
SELECT pg_try_advisory_lock($1);

-- name: partitions_take
-- Session-scoped, one per partition of a namespace ($1): held while the coordinator's own
-- connection lives (saga_coordinator/ownership.py). Run at every look, asked for nothing too:
-- it is the session's beat, which keeps the server's idle_session_timeout from ending it.
SELECT p FROM unnest($2::int[]) AS p WHERE pg_try_advisory_lock(hashtext($1), p);

-- name: outbox_batch
-- What the relay publishes: rows written for it, and rows a committing task wrote to publish
-- itself but has not deleted after $2 seconds (its process died, or the broker was away).
SELECT id, exchange, routing_key, message_id, message_type, order_id, body, headers::text
FROM outbox WHERE NOT direct OR created_at < now() - make_interval(secs => $2)
ORDER BY id LIMIT $1;

-- name: outbox_delete
DELETE FROM outbox WHERE id = ANY($1::bigint[]);

-- name: rejection_insert
INSERT INTO rejections (message_id, saga_id, order_id, command_type, rule, reason, body,
                        transport_id, sender, body_bytes)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10);

-- name: rejection_list
SELECT id, message_id, transport_id, sender, saga_id, order_id, command_type, rule, reason,
       rejected_at
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
                               ORDER BY b.arrival), '[]'::jsonb)
     FROM order_blocks b WHERE b.order_id = $1)::text AS blocks,
    EXISTS (SELECT 1 FROM parked p WHERE p.order_id = $1) AS has_parked,
    EXISTS (SELECT 1 FROM sagas w WHERE w.order_id = $1 AND w.status = 'waiting') AS has_waiting;

-- name: order_get
SELECT order_id, active_saga_id, next_seq, handled, updated_at FROM orders WHERE order_id = $1;

-- name: block_delete
DELETE FROM order_blocks WHERE order_id = $1 AND message_id = $2 RETURNING arrival;

-- name: blocks_for_order
SELECT message_id, state, reason, created_at, arrival FROM order_blocks WHERE order_id = $1
ORDER BY arrival;

-- name: blocked_orders
SELECT b.order_id, b.message_id, b.state, b.reason, b.created_at,
       (SELECT count(*) FROM parked p WHERE p.order_id = b.order_id) AS parked
FROM order_blocks b ORDER BY b.created_at, b.order_id LIMIT $1;

-- name: park_insert
-- $7: the arrival number of the message's own block, for one that failed or was replayed: it
-- keeps its place before the messages parked behind it.
INSERT INTO parked (order_id, message_id, message_type, seq, reason, body, arrival)
VALUES ($1, $2, $3, $4, $5, $6, coalesce($7, nextval('convoy_arrival')))
ON CONFLICT (message_id) DO NOTHING;

-- name: parked_for_order
SELECT id, message_id, message_type, seq, reason, body, parked_at, arrival FROM parked
WHERE order_id = $1 ORDER BY arrival, id;

-- name: parked_delete
DELETE FROM parked WHERE id = $1;

-- name: waiting_next
SELECT state::text FROM sagas WHERE order_id = $1 AND status = 'waiting'
ORDER BY arrival LIMIT 1 FOR UPDATE;

-- name: requests_out
-- The steps whose request is out (an armed deadline of a forward or compensation send) to one
-- of some services, by key patterns ('%:<service>.%'): a first cut, saga_coordinator/lost.py
-- checks each step exactly.
SELECT saga_id, order_id, step, phase, idempotency_key, attempt FROM deadlines
WHERE phase IN ('forward', 'compensation') AND idempotency_key LIKE ANY ($1::text[]);

-- name: deadlines_due
SELECT saga_id, order_id, step, phase, idempotency_key, attempt FROM deadlines
WHERE due_at <= now() ORDER BY due_at LIMIT $1 FOR UPDATE SKIP LOCKED;

-- name: waiting_for_update
UPDATE sagas SET state = jsonb_set(state, '{waiting_for}', to_jsonb($2::text))
WHERE order_id = $1 AND status = 'waiting';

-- name: rejection_record_refusal
-- A command the coordinator refused because of the saga's state or who sent it.
INSERT INTO rejections (message_id, saga_id, order_id, command_type, rule, reason, body, sender)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[],
                     $7::bytea[], $8::text[]);

-- name: order_summary
SELECT o.order_id, o.active_saga_id, o.next_seq, o.handled, o.updated_at,
       (SELECT count(*) FROM parked p WHERE p.order_id = o.order_id) AS parked
FROM orders o WHERE o.order_id = $1;
