-- A coordinator's partitions as its heartbeat says them: those whose locks its lock session held
-- at its last beat (saga_coordinator.ownership), the truth of who consumes them. NULL for an
-- adapter, and for a row written before this column. The Health page showed before what had
-- delivered to a coordinator lately: an idle partition showed nowhere, and one passed on to
-- another process stayed under its old owner until the next beat.
ALTER TABLE processes ADD COLUMN partitions integer[];
