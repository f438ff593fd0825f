-- Named queries of the classic queues' delivery counts (saga_shared.transport/poison.py over
-- delivery_counts, migration 0015).

-- name: delivery_count
-- A redelivery, counted: its first delivery was not (nothing is written for a message handled
-- at its first try), so a row starts at 2. Rows a week old of the same queue go at the same time,
-- a few at a time: only redeliveries write here, so the table stays small without a job.
WITH old AS (
    DELETE FROM delivery_counts
    WHERE ctid IN (SELECT ctid FROM delivery_counts
                   WHERE queue = $1 AND first_at < now() - interval '7 days' LIMIT 100)
)
INSERT INTO delivery_counts AS c (queue, message_id, deliveries)
SELECT DISTINCT $1, m, 2 FROM unnest($2::text[]) AS m
ON CONFLICT (queue, message_id) DO UPDATE SET deliveries = c.deliveries + 1, last_at = now()
RETURNING message_id, deliveries;
