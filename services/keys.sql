-- Named queries of the services' key record (services/keys.py over service_keys, migration
-- 0012). jsonb travels as text: the pools come from callers without a jsonb codec.

-- name: claim
SELECT n, verdict, attempt, result::text AS result, error, landed, owner, lease_left
FROM key_claim($1, $2, $3, $4::text[], $5::text[], $6::text[], $7::int[], $8::int[],
               $9::float8[]);

-- name: finish
-- The outcomes of one owner's claims, in one statement; a claim that is no longer this
-- owner's or no longer unfinished (taken over, fenced, finished) is left as it is. released:
-- given up unfinished, the lease ends now; returned: the same, and the try is given back (the
-- function broke: such a message is bounded by the delivery limit, not by the attempts).
UPDATE service_keys s
SET outcome = CASE WHEN f.outcome IN ('released', 'returned') THEN s.outcome ELSE f.outcome END,
    result = CASE WHEN f.outcome IN ('released', 'returned') THEN s.result
                  ELSE f.result::jsonb END,
    error = CASE WHEN f.outcome IN ('released', 'returned') THEN s.error ELSE f.error END,
    landed = s.landed OR f.landed,
    attempt = CASE WHEN f.outcome = 'returned' THEN greatest(s.attempt - 1, 0) ELSE s.attempt END,
    lease_until = CASE WHEN f.outcome IN ('released', 'returned') THEN now()
                       ELSE s.lease_until END,
    finished_at = CASE WHEN f.outcome IN ('released', 'returned') THEN s.finished_at
                       ELSE now() END
FROM unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::boolean[])
    AS f (key, outcome, result, error, landed)
WHERE s.key = ANY($2::text[]) AND s.key = f.key AND s.outcome = 'pending' AND s.owner = $1;

-- name: settle
SELECT verdict, result::text AS result, error, landed, owner, lease_left, fenced_now, claims
FROM key_settle($1, $2, $3, $4, $5);

-- name: fence
SELECT verdict, result::text AS result, error, landed, owner, lease_left, fenced_now, claims
FROM key_fence($1, $2, $3, $4, $5, $6);

-- name: record
-- The system said an unfinished claim is done (the service's status hook): stored as done.
UPDATE service_keys SET outcome = 'done', result = $2::jsonb, finished_at = now()
WHERE key = $1 AND outcome = 'pending';
