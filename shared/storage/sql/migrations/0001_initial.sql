-- The coordinator's tables: sagas (state and register), inbox (dedupe), outbox (to publish),
-- the log of handled messages, and refused commands.

CREATE TABLE sagas (
    saga_id     text PRIMARY KEY,
    order_id    text NOT NULL,
    saga        text NOT NULL,
    status      text NOT NULL,
    state       jsonb NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX sagas_order_idx ON sagas (order_id, created_at);
CREATE INDEX sagas_status_idx ON sagas (status, updated_at);

-- One row per consumed message: the primary key absorbs redelivered duplicates in the same
-- transaction as the state change they would otherwise repeat.
CREATE TABLE inbox (
    message_id   text PRIMARY KEY,
    saga_id      text NOT NULL,
    received_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE outbox (
    id            bigserial PRIMARY KEY,
    exchange      text NOT NULL,
    routing_key   text NOT NULL,
    message_id    text NOT NULL,
    message_type  text NOT NULL,
    order_id      text NOT NULL,
    body          bytea NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE saga_log (
    id            bigserial PRIMARY KEY,
    saga_id       text NOT NULL,
    order_id      text NOT NULL,
    message_id    text NOT NULL,
    message_type  text NOT NULL,
    note          text NOT NULL DEFAULT '',
    handled_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX saga_log_saga_idx ON saga_log (saga_id, id);
CREATE INDEX saga_log_order_idx ON saga_log (order_id, id);

CREATE TABLE rejections (
    id            bigserial PRIMARY KEY,
    message_id    text,
    saga_id       text,
    order_id      text,
    command_type  text,
    rule          text NOT NULL,
    reason        text NOT NULL,
    body          bytea NOT NULL,
    rejected_at   timestamptz NOT NULL DEFAULT now()
);

-- The simulated external systems. Each keeps its own tables; the idempotency table stores the
-- first result per key, failures too, as Stripe does.

CREATE TABLE sim_idempotency (
    key         text PRIMARY KEY,
    system      text NOT NULL,
    action      text NOT NULL,
    order_id    text NOT NULL,
    outcome     text NOT NULL CHECK (outcome IN ('pending', 'done', 'failed')),
    result      jsonb,
    error       text,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX sim_idempotency_order_idx ON sim_idempotency (order_id);

CREATE TABLE sim_faults (
    action      text NOT NULL,
    order_id    text NOT NULL,
    mode        text NOT NULL CHECK (mode IN ('permanent', 'transient')),
    remaining   integer,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (action, order_id)
);

-- Every side effect applied, one row each: "applied N times" is counted here.
CREATE TABLE sim_effects (
    id               bigserial PRIMARY KEY,
    system           text NOT NULL,
    action           text NOT NULL,
    order_id         text NOT NULL,
    idempotency_key  text NOT NULL,
    entity_id        text NOT NULL,
    detail           jsonb NOT NULL DEFAULT '{}',
    applied_at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX sim_effects_order_idx ON sim_effects (order_id, id);

CREATE TABLE sim_inventory_reservations (
    reservation_id  text PRIMARY KEY,
    order_id        text NOT NULL,
    sku             text NOT NULL,
    quantity        integer NOT NULL,
    status          text NOT NULL CHECK (status IN ('reserved', 'released')),
    created_at      timestamptz NOT NULL DEFAULT now(),
    released_at     timestamptz
);
CREATE INDEX sim_inventory_reservations_order_idx ON sim_inventory_reservations (order_id);

CREATE TABLE sim_erp_credit_notes (
    credit_note_id  text PRIMARY KEY,
    order_id        text NOT NULL,
    amount_cents    integer NOT NULL,
    status          text NOT NULL CHECK (status IN ('issued', 'voided')),
    created_at      timestamptz NOT NULL DEFAULT now(),
    voided_at       timestamptz
);
CREATE INDEX sim_erp_credit_notes_order_idx ON sim_erp_credit_notes (order_id);

CREATE TABLE sim_payments_charges (
    payment_id    text PRIMARY KEY,
    order_id      text NOT NULL,
    amount_cents  integer NOT NULL,
    card_token    text NOT NULL,
    status        text NOT NULL CHECK (status IN ('charged', 'refunded')),
    refund_id     text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    refunded_at   timestamptz
);
CREATE INDEX sim_payments_charges_order_idx ON sim_payments_charges (order_id);

CREATE TABLE sim_email_messages (
    email_id   text PRIMARY KEY,
    order_id   text NOT NULL,
    recipient  text NOT NULL,
    template   text NOT NULL,
    sent_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX sim_email_messages_order_idx ON sim_email_messages (order_id);
