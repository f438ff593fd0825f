-- How often each message of a classic queue (the request queues) was delivered, for the delivery
-- limit the broker keeps only for quorum queues (saga_shared/transport/poison.py). Only a
-- redelivery writes here: a message handled at its first delivery leaves no row.
CREATE TABLE delivery_counts (
    queue       text NOT NULL,
    message_id  text NOT NULL,
    deliveries  integer NOT NULL,
    first_at    timestamptz NOT NULL DEFAULT now(),
    last_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue, message_id)
);

-- Every component that consumes a request queue counts in it (the coordinator forgets a row
-- once its dead letter is stored).
CREATE OR REPLACE FUNCTION saga_grant_counts(prefix text) RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    service text;
BEGIN
    EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON delivery_counts TO %I',
                   prefix || 'coordinator');
    FOREACH service IN ARRAY ARRAY['inventory', 'erp', 'payments', 'email'] LOOP
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON delivery_counts TO %I',
                       prefix || service);
    END LOOP;
    EXECUTE format('GRANT SELECT ON delivery_counts TO %I', prefix || 'reader');
    EXECUTE format('GRANT SELECT ON delivery_counts TO %I', prefix || 'operator');
END
$fn$;
