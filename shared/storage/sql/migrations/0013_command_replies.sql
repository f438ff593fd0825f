-- The answer the coordinator gave each command it handled, by the command's message id (as
-- the inbox has it): a command sent again under the same id is absorbed as before, and now
-- answered again with this, so an agent that retries always hears back (design rule 12).
CREATE TABLE command_replies (
    message_id  text PRIMARY KEY,
    body        bytea NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE OR REPLACE FUNCTION saga_grant_replies(prefix text) RETURNS void
LANGUAGE plpgsql AS $fn$
BEGIN
    EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON command_replies TO %I',
                   prefix || 'coordinator');
    EXECUTE format('GRANT SELECT ON command_replies TO %I', prefix || 'reader');
    EXECUTE format('GRANT SELECT ON command_replies TO %I', prefix || 'operator');
END
$fn$;
