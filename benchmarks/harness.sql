-- Counters of the benchmark database, read before and after the timed load.

-- name: counters
-- xact_commit counts every backend's commits in this database; outbox inserts are the messages
-- the coordinator published; outcomes are the adapters' replies the coordinator handled.
SELECT
    (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()) AS transactions,
    (SELECT n_tup_ins FROM pg_stat_user_tables WHERE relname = 'outbox') AS outbox_rows,
    (SELECT count(*) FROM saga_log WHERE message_type IN ('action.done', 'action.failed'))
        AS outcomes,
    -- What reaches a partition through its quorum queue besides the commands: settles'
    -- answers and deadlines (outcomes travel through the classic outcome queues).
    (SELECT count(*) FROM saga_log WHERE message_type IN ('action.settled', 'saga.deadline'))
        AS quorum_replies,
    -- The whole server's WAL: nothing else writes while a measurement runs.
    (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint AS wal_bytes;
