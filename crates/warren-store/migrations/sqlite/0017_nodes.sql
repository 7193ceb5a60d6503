-- Cluster membership (issue 14): one row per node id, with the epoch of its newest
-- registration and a lease renewed by the node itself. Times are unix milliseconds.
CREATE TABLE nodes (
    node_id TEXT PRIMARY KEY NOT NULL,
    advertise TEXT NOT NULL,
    epoch INTEGER NOT NULL,
    registered_at INTEGER NOT NULL,
    renewed_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    left_at INTEGER,
    ttl_ms INTEGER NOT NULL
);
