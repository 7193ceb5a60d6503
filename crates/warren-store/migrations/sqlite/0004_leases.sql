-- Leases (I25): each run of a root execution tree holds one; a runtime is reclaimed only
-- when none is live. A lease that is not renewed expires (its holder crashed).
CREATE TABLE leases (
    id TEXT PRIMARY KEY,
    sandbox_id TEXT NOT NULL REFERENCES sandboxes(id),
    generation INTEGER NOT NULL,
    holder TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL
);
CREATE INDEX leases_by_sandbox ON leases (sandbox_id, expires_at);
