-- Execution guards (issue 13): one row per sandbox that ever had a guard. The row outlives
-- every holder so its token only ever grows: a new holder gets token + 1, and a write
-- fenced with an older token is refused. Releasing sets expires_at to now; the row stays.
CREATE TABLE guards (
    sandbox_id  TEXT    NOT NULL PRIMARY KEY REFERENCES sandboxes (id),
    token       INTEGER NOT NULL CHECK (token >= 1),
    holder      TEXT    NOT NULL,
    acquired_at INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL,
    -- The lifetime of the last grant or renewal: what a renewal naming none extends by.
    ttl_ms      INTEGER NOT NULL CHECK (ttl_ms >= 0)
);
