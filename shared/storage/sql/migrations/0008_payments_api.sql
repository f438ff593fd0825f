-- The HTTP payments service (services/payments_http/api.py) stands for a real payment API: its
-- tables are its own, kept in this database only so the demo needs nothing more to run.

-- Stripe-like idempotency: the first response per Idempotency-Key is stored and replayed; a
-- reused key with other parameters is refused (fingerprint).
CREATE TABLE payapi_requests (
    key text PRIMARY KEY,
    fingerprint text NOT NULL,
    status integer NOT NULL,
    body text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE payapi_charges (
    id text PRIMARY KEY,
    idempotency_key text NOT NULL UNIQUE,
    order_id text NOT NULL,
    amount_cents bigint NOT NULL,
    card_token text NOT NULL,
    refund_id text,
    created_at timestamptz NOT NULL DEFAULT now(),
    refunded_at timestamptz
);
CREATE INDEX payapi_charges_order ON payapi_charges (order_id);
