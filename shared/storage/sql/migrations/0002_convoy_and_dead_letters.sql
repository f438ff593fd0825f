-- Per-order convoy state, parked messages, dead letters and the operators' audit trail.

-- One row per order: the saga holding it, the next command sequence number expected from the
-- intake, and how many messages were handled (the per-order handling sequence).
CREATE TABLE orders (
    order_id        text PRIMARY KEY,
    active_saga_id  text,
    next_seq        bigint NOT NULL DEFAULT 1,
    handled         bigint NOT NULL DEFAULT 0,
    updated_at      timestamptz NOT NULL DEFAULT now()
);

-- Why an order is blocked: a message of it failed (retrying), was dead-lettered (dead), or was
-- replayed and not yet handled again (replaying). An order with any row here is blocked.
CREATE TABLE order_blocks (
    order_id    text NOT NULL,
    message_id  text NOT NULL,
    state       text NOT NULL CHECK (state IN ('retrying', 'dead', 'replaying')),
    reason      text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (order_id, message_id)
);

-- Later messages of a blocked order wait here, in arrival order, until it is unblocked.
CREATE TABLE parked (
    id          bigserial PRIMARY KEY,
    order_id    text NOT NULL,
    message_id  text NOT NULL UNIQUE,
    message_type text NOT NULL,
    seq         bigint,
    reason      text NOT NULL,
    body        bytea NOT NULL,
    parked_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX parked_order_idx ON parked (order_id, id);

-- The intake numbers each order's commands in arrival order; the same message keeps its number
-- when redelivered or replayed.
CREATE TABLE intake_seqs (
    order_id  text PRIMARY KEY,
    last_seq  bigint NOT NULL
);
CREATE TABLE command_seqs (
    message_id  text PRIMARY KEY,
    order_id    text NOT NULL,
    seq         bigint NOT NULL,
    UNIQUE (order_id, seq)
);

-- Every failed handling attempt, so a dead letter carries the last error text.
CREATE TABLE delivery_failures (
    message_id   text PRIMARY KEY,
    order_id     text,
    queue        text NOT NULL,
    attempts     integer NOT NULL DEFAULT 1,
    last_error   text NOT NULL,
    first_at     timestamptz NOT NULL DEFAULT now(),
    last_at      timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE dead_letters (
    id               bigserial PRIMARY KEY,
    message_id       text UNIQUE,
    message_type     text,
    order_id         text,
    saga_id          text,
    source_queue     text,
    exchange         text NOT NULL,
    routing_key      text NOT NULL,
    reason           text NOT NULL,
    error            text,
    delivery_count   integer NOT NULL,
    first_failed_at  timestamptz,
    last_failed_at   timestamptz NOT NULL,
    headers          jsonb NOT NULL,
    body             bytea NOT NULL,
    status           text NOT NULL CHECK (status IN ('dead', 'replayed', 'discarded')),
    times_dead       integer NOT NULL DEFAULT 1,
    history          jsonb NOT NULL DEFAULT '[]',
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX dead_letters_order_idx ON dead_letters (order_id, id);
CREATE INDEX dead_letters_status_idx ON dead_letters (status, id);

CREATE TABLE dlq_audit (
    id              bigserial PRIMARY KEY,
    dead_letter_id  bigint NOT NULL REFERENCES dead_letters (id),
    action          text NOT NULL CHECK (action IN ('replay', 'discard')),
    actor           text NOT NULL,
    note            text NOT NULL DEFAULT '',
    at              timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX dlq_audit_dead_letter_idx ON dlq_audit (dead_letter_id, id);

ALTER TABLE outbox ADD COLUMN headers jsonb NOT NULL DEFAULT '{}';
ALTER TABLE saga_log ADD COLUMN seq bigint;
-- Arrival order of sagas: waiting sagas of an order start in this order (several may be
-- created in one transaction, with one timestamp, when parked messages drain).
ALTER TABLE sagas ADD COLUMN arrival bigserial;
CREATE INDEX sagas_waiting_idx ON sagas (order_id, arrival) WHERE status = 'waiting';
