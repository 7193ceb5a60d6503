-- Snapshot chunks and manifests kept in the state store itself (I31): for deployments
-- whose only shared storage is the SQL database. Keys are namespaced by owner (a uid), so
-- stores of two uids never share or see each other's objects.
CREATE TABLE snapshot_objects (
    owner TEXT NOT NULL,
    key TEXT NOT NULL,
    bytes BLOB NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (owner, key)
);
