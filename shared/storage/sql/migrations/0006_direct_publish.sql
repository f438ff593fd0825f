-- The coordinator publishes what a transaction wrote to the outbox right after the commit, from
-- the task that committed it, and deletes the rows in its next statement. Such rows are marked
-- `direct`: the relay leaves them alone while they are young and publishes them only when their
-- process died before it could (a crash between commit and publish).
ALTER TABLE outbox ADD COLUMN direct boolean NOT NULL DEFAULT false;
CREATE INDEX outbox_relay_idx ON outbox (id) WHERE NOT direct;
