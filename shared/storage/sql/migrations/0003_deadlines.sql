-- Step deadlines: one per saga (a saga has at most one action in flight). Survive restarts;
-- polled with FOR UPDATE SKIP LOCKED so several coordinators never fire one twice.
CREATE TABLE deadlines (
    saga_id          text PRIMARY KEY,
    order_id         text NOT NULL,
    step             integer NOT NULL,
    phase            text NOT NULL CHECK (phase IN ('forward', 'compensation', 'gate')),
    idempotency_key  text NOT NULL,
    attempt          integer NOT NULL,
    due_at           timestamptz NOT NULL
);
CREATE INDEX deadlines_due_idx ON deadlines (due_at);
