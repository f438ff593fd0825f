-- Counters of the benchmark database, read before and after the timed load.

-- name: counters
-- xact_commit counts every backend's commits in this database; outbox inserts are the messages
-- the relay published; outcomes are the adapters' replies the coordinator handled.
SELECT
    (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()) AS transactions,
    (SELECT n_tup_ins FROM pg_stat_user_tables WHERE relname = 'outbox') AS outbox_rows,
    (SELECT count(*) FROM saga_log WHERE message_type IN ('action.done', 'action.failed'))
        AS outcomes;
