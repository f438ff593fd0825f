-- The console lists sagas newest first, filtered or not: without this index every page of the
-- unfiltered list sorts the whole table. It costs one index entry per saga row version.
CREATE INDEX sagas_created_idx ON sagas (created_at, saga_id);
