-- What the coordinator reads for the gauges of shared/metrics.py (every SAGA_METRICS_POLL_S).

-- name: gauges
-- One snapshot; every count is served by an index (sagas_status_idx, order_blocks_pkey,
-- outbox_pkey), so it stays cheap with millions of sagas stored.
SELECT
    (SELECT count(DISTINCT order_id) FROM order_blocks) AS orders_blocked,
    (SELECT count(*) FROM sagas WHERE status = 'waiting') AS waiting,
    (SELECT count(*) FROM sagas WHERE status = 'needs_human') AS needs_human,
    (SELECT count(*) FROM sagas WHERE status = 'awaiting_approval') AS awaiting_approval,
    (SELECT extract(epoch FROM now() - min(updated_at)) FROM sagas
     WHERE status = 'needs_human') AS needs_human_oldest_s,
    (SELECT extract(epoch FROM now() - min(updated_at)) FROM sagas
     WHERE status = 'awaiting_approval') AS awaiting_approval_oldest_s,
    (SELECT count(*) FROM outbox) AS outbox_depth,
    (SELECT extract(epoch FROM now() - min(created_at)) FROM outbox) AS outbox_lag_s;

-- name: processes
-- Each component's processes by state (migration 0014); a stopped one counts as neither.
SELECT kind, name,
       count(*) FILTER (WHERE stopped_at IS NULL AND beat_at >= now() - $1 * interval '1 second')
           AS alive,
       count(*) FILTER (WHERE stopped_at IS NULL AND beat_at < now() - $1 * interval '1 second')
           AS silent
FROM processes WHERE namespace = $2 GROUP BY kind, name;

-- name: processes_replaced
-- A silent process whose component has started again on its host since was restarted: it is
-- taken as stopped when it last beat, so its silence no longer alerts.
UPDATE processes p SET stopped_at = p.beat_at
WHERE p.stopped_at IS NULL AND p.beat_at < now() - $1 * interval '1 second'
  AND EXISTS (SELECT 1 FROM processes q
              WHERE q.namespace = p.namespace AND q.kind = p.kind AND q.name = p.name
                AND q.host = p.host AND q.started_at > p.beat_at);

-- name: processes_forget
-- A stopped process's row is kept an hour (the console shows it went away), a silent one a
-- day: long enough for the alert and a person to see it.
DELETE FROM processes
WHERE stopped_at < now() - interval '1 hour' OR beat_at < now() - interval '1 day';
