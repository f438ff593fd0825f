-- Named queries of the preload (benchmarks/preload.py), loaded by saga_shared.storage.sql.Queries.
--
-- Python runs the pure state machine once per kind of saga and loads what one run leaves behind
-- into temporary tables: the final register, the messages handled, the calls to the simulated
-- systems. Each chunk then expands those templates for its sagas, table by table. Every template
-- text is a format() string: format(text, VARIADIC args) puts in the saga's own ids, start second
-- and entity ids (preload_chunk.args), so every row has ids of its own and a real one's size.

-- name: create_templates
CREATE TEMP TABLE preload_kinds (
    kind       integer PRIMARY KEY,
    saga       text NOT NULL,
    status     text NOT NULL,
    state      text NOT NULL,
    handled     integer NOT NULL,
    created_us  integer NOT NULL,
    updated_us  integer NOT NULL
);
CREATE TEMP TABLE preload_messages (
    kind          integer NOT NULL,
    k             integer NOT NULL,
    message_type  text NOT NULL,
    note          text NOT NULL,
    at_us         integer NOT NULL
);
CREATE TEMP TABLE preload_calls (
    kind      integer NOT NULL,
    k         integer NOT NULL,
    key       text NOT NULL,
    system    text NOT NULL,
    action    text NOT NULL,
    outcome   text NOT NULL,
    result    text,
    error     text,
    entity    text,
    detail    text,
    params    jsonb NOT NULL,
    at_us     integer NOT NULL
);
-- The sagas of the chunk being written; t0 is the second each started in.
CREATE TEMP TABLE preload_chunk (
    n         bigint NOT NULL,
    saga_id   text NOT NULL,
    order_id  text NOT NULL,
    kind      integer NOT NULL,
    t0        timestamptz NOT NULL,
    args      text[] NOT NULL
) ON COMMIT DELETE ROWS;

-- name: kind_insert
INSERT INTO preload_kinds VALUES ($1, $2, $3, $4, $5, $6, $7);

-- name: message_insert
INSERT INTO preload_messages VALUES ($1, $2, $3, $4, $5);

-- name: call_insert
INSERT INTO preload_calls VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11::jsonb, $12);

-- name: sagas_exist
-- Preloaded ids are fixed (pre-saga-N): a second preload would collide with the first.
SELECT EXISTS (SELECT 1 FROM sagas WHERE saga_id LIKE 'pre-saga-%');

-- name: setup_only
-- Setup, not measurement: no commit waits for its WAL flush; a crash could lose the last
-- chunks (the preload is redone then), never corrupt anything.
SET LOCAL synchronous_commit = off;

-- name: chunk_fill
-- Saga n starts in second $3 + n, so every timestamp index holds distinct keys as a real one
-- would; $4 is the mix, one kind per n % cardinality($4). The args follow the order of
-- preload.STAND_INS: saga id, order id, start second, then the random part of each entity id
-- (32 hex digits, as uuid4().hex), one per entity so the register compresses like a real one.
INSERT INTO preload_chunk (n, saga_id, order_id, kind, t0, args)
SELECT n, saga_id, order_id, ($4::int[])[n % cardinality($4::int[]) + 1], t0,
       ARRAY[saga_id, order_id, to_char(t0 AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS'),
             md5(saga_id || ':res'), md5(saga_id || ':cn'), md5(saga_id || ':pay'),
             md5(saga_id || ':re'), md5(saga_id || ':em')]
FROM generate_series($1::bigint, $2::bigint) AS n,
     LATERAL (SELECT 'pre-saga-' || n AS saga_id, 'pre-order-' || n AS order_id,
                     $3::timestamptz + n * interval '1 second' AS t0) AS t;

-- name: sagas_insert
INSERT INTO sagas (saga_id, order_id, saga, status, state, created_at, updated_at)
SELECT c.saga_id, c.order_id, k.saga, k.status, format(k.state, VARIADIC c.args)::jsonb,
       c.t0 + k.created_us * interval '1 microsecond',
       c.t0 + k.updated_us * interval '1 microsecond'
FROM preload_chunk c JOIN preload_kinds k USING (kind)
ORDER BY c.n;

-- name: orders_insert
INSERT INTO orders (order_id, active_saga_id, next_seq, handled, updated_at)
SELECT c.order_id, NULL, 2, k.handled, c.t0 + k.updated_us * interval '1 microsecond'
FROM preload_chunk c JOIN preload_kinds k USING (kind)
ORDER BY c.n;

-- name: intake_seqs_insert
INSERT INTO intake_seqs (order_id, last_seq)
SELECT order_id, 1 FROM preload_chunk ORDER BY n;

-- name: command_seqs_insert
-- The start command is message 1 of its saga; its id is the one the inbox gets below.
INSERT INTO command_seqs (message_id, order_id, seq)
SELECT md5(saga_id || ':1')::uuid::text, order_id, 1 FROM preload_chunk ORDER BY n;

-- name: inbox_insert
-- Message ids are uuid-shaped and random, as the agents' uuid4 and the adapters' uuid5 are, so
-- the primary key grows by random inserts like the real one.
INSERT INTO inbox (message_id, saga_id, received_at)
SELECT md5(c.saga_id || ':' || m.k)::uuid::text, c.saga_id,
       c.t0 + m.at_us * interval '1 microsecond'
FROM preload_chunk c JOIN preload_messages m USING (kind)
ORDER BY c.n, m.k;

-- name: saga_log_insert
INSERT INTO saga_log (saga_id, order_id, message_id, message_type, note, handled_at, seq)
SELECT c.saga_id, c.order_id, md5(c.saga_id || ':' || m.k)::uuid::text, m.message_type, m.note,
       c.t0 + m.at_us * interval '1 microsecond', m.k
FROM preload_chunk c JOIN preload_messages m USING (kind)
ORDER BY c.n, m.k;

-- name: idempotency_insert
INSERT INTO service_keys (key, system, action, order_id, outcome, result, error, created_at)
SELECT format(p.key, VARIADIC c.args), p.system, p.action, c.order_id, p.outcome,
       format(p.result, VARIADIC c.args)::jsonb, p.error,
       c.t0 + p.at_us * interval '1 microsecond'
FROM preload_chunk c JOIN preload_calls p USING (kind)
ORDER BY c.n, p.k;

-- name: effects_insert
INSERT INTO sim_effects (system, action, order_id, idempotency_key, entity_id, detail, applied_at)
SELECT p.system, p.action, c.order_id, format(p.key, VARIADIC c.args),
       format(p.entity, VARIADIC c.args), format(p.detail, VARIADIC c.args)::jsonb,
       c.t0 + p.at_us * interval '1 microsecond'
FROM preload_chunk c JOIN preload_calls p USING (kind)
WHERE p.entity IS NOT NULL
ORDER BY c.n, p.k;

-- The systems' own tables, as services/*/system.py write them: the forward action inserts the
-- entity, its compensation (when the run had one) changes its status.

-- name: reservations_insert
INSERT INTO sim_inventory_reservations
    (reservation_id, order_id, sku, quantity, status, created_at, released_at)
SELECT format(f.entity, VARIADIC c.args), c.order_id, f.params->>'sku',
       (f.params->>'quantity')::integer, CASE WHEN u.k IS NULL THEN 'reserved' ELSE 'released' END,
       c.t0 + f.at_us * interval '1 microsecond', c.t0 + u.at_us * interval '1 microsecond'
FROM preload_chunk c
JOIN preload_calls f ON f.kind = c.kind AND f.action = 'inventory.reserve_stock'
    AND f.entity IS NOT NULL
LEFT JOIN preload_calls u ON u.kind = c.kind AND u.action = 'inventory.release_stock'
    AND u.entity IS NOT NULL
ORDER BY c.n;

-- name: credit_notes_insert
INSERT INTO sim_erp_credit_notes (credit_note_id, order_id, amount_cents, status, created_at,
                                  voided_at)
SELECT format(f.entity, VARIADIC c.args), c.order_id, (f.params->>'amount_cents')::integer,
       CASE WHEN u.k IS NULL THEN 'issued' ELSE 'voided' END,
       c.t0 + f.at_us * interval '1 microsecond', c.t0 + u.at_us * interval '1 microsecond'
FROM preload_chunk c
JOIN preload_calls f ON f.kind = c.kind AND f.action = 'erp.create_credit_note'
    AND f.entity IS NOT NULL
LEFT JOIN preload_calls u ON u.kind = c.kind AND u.action = 'erp.void_credit_note'
    AND u.entity IS NOT NULL
ORDER BY c.n;

-- name: charges_insert
INSERT INTO sim_payments_charges (payment_id, order_id, amount_cents, card_token, status,
                                  refund_id, created_at, refunded_at)
SELECT format(f.entity, VARIADIC c.args), c.order_id, (f.params->>'amount_cents')::integer,
       f.params->>'card_token', CASE WHEN u.k IS NULL THEN 'charged' ELSE 'refunded' END,
       format(u.detail, VARIADIC c.args)::jsonb->>'refund_id',
       c.t0 + f.at_us * interval '1 microsecond', c.t0 + u.at_us * interval '1 microsecond'
FROM preload_chunk c
JOIN preload_calls f ON f.kind = c.kind AND f.action = 'payments.charge_card'
    AND f.entity IS NOT NULL
LEFT JOIN preload_calls u ON u.kind = c.kind AND u.action = 'payments.refund_charge'
    AND u.entity IS NOT NULL
ORDER BY c.n;

-- name: emails_insert
INSERT INTO sim_email_messages (email_id, order_id, recipient, template, sent_at)
SELECT format(f.entity, VARIADIC c.args), c.order_id, f.params->>'customer_email',
       split_part(f.action, '.', 2), c.t0 + f.at_us * interval '1 microsecond'
FROM preload_chunk c
JOIN preload_calls f ON f.kind = c.kind AND f.system = 'email' AND f.entity IS NOT NULL
ORDER BY c.n;

-- name: vacuum_analyze
VACUUM ANALYZE;

-- name: row_counts
-- Every table a finished saga leaves rows in, and the two it must leave empty.
SELECT 'sagas' AS name, count(*) AS n FROM sagas
UNION ALL SELECT 'orders', count(*) FROM orders
UNION ALL SELECT 'inbox', count(*) FROM inbox
UNION ALL SELECT 'saga_log', count(*) FROM saga_log
UNION ALL SELECT 'command_seqs', count(*) FROM command_seqs
UNION ALL SELECT 'intake_seqs', count(*) FROM intake_seqs
UNION ALL SELECT 'outbox', count(*) FROM outbox
UNION ALL SELECT 'deadlines', count(*) FROM deadlines
UNION ALL SELECT 'service_keys', count(*) FROM service_keys
UNION ALL SELECT 'sim_effects', count(*) FROM sim_effects
UNION ALL SELECT 'sim_inventory_reservations', count(*) FROM sim_inventory_reservations
UNION ALL SELECT 'sim_erp_credit_notes', count(*) FROM sim_erp_credit_notes
UNION ALL SELECT 'sim_payments_charges', count(*) FROM sim_payments_charges
UNION ALL SELECT 'sim_email_messages', count(*) FROM sim_email_messages;

-- name: database_bytes
SELECT pg_database_size(current_database());
