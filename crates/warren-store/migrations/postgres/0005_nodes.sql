-- Cluster membership (issue 14): one row per node id, with the epoch of its newest
-- registration and a lease renewed by the node itself, judged by the database's clock.
-- Times are unix milliseconds.
CREATE TABLE nodes (
    node_id TEXT PRIMARY KEY,
    advertise TEXT NOT NULL,
    epoch BIGINT NOT NULL,
    registered_at BIGINT NOT NULL,
    renewed_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL,
    left_at BIGINT,
    ttl_ms BIGINT NOT NULL
);
