-- What a run is, for the records `GET /v1/sandboxes/{id}/runs` and `GET /v1/users/{uid}/runs`
-- serve (I22): `kind` is `exec` (a command the caller waits for; every run before kinds
-- existed) or `process` (a long-running process the caller starts and comes back to),
-- `tag` the caller's own label for it, `pty` whether it runs on a terminal.
ALTER TABLE runs ADD COLUMN kind TEXT NOT NULL DEFAULT 'exec' CHECK (kind IN ('exec', 'process'));
ALTER TABLE runs ADD COLUMN tag TEXT;
ALTER TABLE runs ADD COLUMN pty INTEGER NOT NULL DEFAULT 0 CHECK (pty IN (0, 1));

-- Listings page newest first by (started_at, id): the index carries the tie-break, so a
-- page resumes from its cursor without a sort.
DROP INDEX runs_by_sandbox;
CREATE INDEX runs_by_sandbox ON runs (sandbox_id, started_at, id);
