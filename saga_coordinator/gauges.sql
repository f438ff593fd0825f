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
