-- A sandbox created "from_snapshot" (I30) starts its first runtime from that snapshot,
-- which may come from another sandbox of the same uid.
ALTER TABLE sandboxes ADD COLUMN seed_snapshot TEXT;
