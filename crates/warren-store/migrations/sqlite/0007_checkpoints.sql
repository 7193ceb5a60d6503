-- Workdir checkpoints (I28): a manifest in the uid's snapshot store, recorded once the
-- manifest is written (the engine's commit point), so a listed checkpoint always restores.
CREATE TABLE checkpoints (
    id TEXT PRIMARY KEY,
    sandbox_id TEXT NOT NULL REFERENCES sandboxes(id),
    workdir TEXT NOT NULL,
    manifest TEXT NOT NULL,
    files INTEGER NOT NULL,
    bytes INTEGER NOT NULL,
    created_at INTEGER NOT NULL
);
CREATE INDEX checkpoints_by_sandbox ON checkpoints (sandbox_id, created_at);
