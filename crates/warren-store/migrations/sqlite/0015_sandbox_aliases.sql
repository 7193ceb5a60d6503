-- Names other systems give a sandbox (DeerFlow's 8-hex sandbox ids), per namespace. An
-- alias points at one sandbox for good: it is never moved to another, so every replica
-- resolves it the same way.
CREATE TABLE sandbox_aliases (
    namespace  TEXT    NOT NULL,
    alias      TEXT    NOT NULL,
    sandbox_id TEXT    NOT NULL REFERENCES sandboxes (id),
    created_at INTEGER NOT NULL,
    PRIMARY KEY (namespace, alias)
);
