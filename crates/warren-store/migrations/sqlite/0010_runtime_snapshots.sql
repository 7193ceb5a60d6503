-- Runtime snapshots (I30): the copy-on-write layers and /home/gem of a runtime, as two
-- manifests in the uid's snapshot store, so a reaped runtime resumes with its installed
-- dependencies and files.
CREATE TABLE runtime_snapshots (
    id TEXT PRIMARY KEY,
    sandbox_id TEXT NOT NULL REFERENCES sandboxes(id),
    generation INTEGER NOT NULL,
    cow_manifest TEXT NOT NULL,
    home_manifest TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    reason TEXT NOT NULL,
    created_at INTEGER NOT NULL
);
CREATE INDEX runtime_snapshots_by_sandbox ON runtime_snapshots (sandbox_id, created_at);
