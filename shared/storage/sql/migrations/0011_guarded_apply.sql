-- The coordinator's one-statement apply (`apply_batch` in saga_coordinator/queries.sql) decides
-- from what its process last committed and checks, in the statement that writes, that the
-- database still holds exactly that. When it does not, this aborts the statement (and so its
-- implicit transaction): nothing of it stays, and the coordinator reads under locks instead.
CREATE OR REPLACE FUNCTION saga_guard(held boolean) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT held THEN
        RAISE EXCEPTION 'the view the decision was made on has changed'
            USING ERRCODE = 'SG001';
    END IF;
    RETURN true;
END
$$;
