-- A component's row in `processes` (migration 0014): written by the component itself.

-- name: beat
-- The counts of the beat before move to `before`, so a reader gets rates from one row.
-- partitions: a coordinator's, those it holds the locks of (migration 0016); NULL for an adapter.
INSERT INTO processes (id, namespace, kind, name, host, pid, version, queues, partitions)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8::jsonb, $9::integer[])
ON CONFLICT (id) DO UPDATE
SET before = processes.queues, before_at = processes.beat_at, queues = EXCLUDED.queues,
    partitions = EXCLUDED.partitions, beat_at = now(), stopped_at = NULL;

-- name: stopped
UPDATE processes SET stopped_at = now(), beat_at = now() WHERE id = $1;
