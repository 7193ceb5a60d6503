-- Artifacts (I26): files an agent presented from its workdir's outputs/. The bytes are
-- copied into the data directory's artifact store (content-addressed per uid), so an
-- artifact stays readable, unchanged, after the runtime or even the file is gone.
CREATE TABLE artifacts (
    id TEXT PRIMARY KEY,
    sandbox_id TEXT NOT NULL REFERENCES sandboxes(id),
    uid TEXT NOT NULL,
    path TEXT NOT NULL,
    size INTEGER NOT NULL,
    sha256 TEXT NOT NULL,
    media_type TEXT NOT NULL,
    created_at INTEGER NOT NULL
);
CREATE INDEX artifacts_by_sandbox ON artifacts (sandbox_id, created_at);
