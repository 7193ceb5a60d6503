-- Names other systems give a sandbox (DeerFlow's 8-hex sandbox ids), per namespace. An
-- alias points at one sandbox for good: it is never moved to another, so every replica
-- resolves it the same way.
CREATE TABLE sandbox_aliases (
    namespace  TEXT COLLATE "C" NOT NULL,
    alias      TEXT COLLATE "C" NOT NULL,
    sandbox_id TEXT COLLATE "C" NOT NULL REFERENCES sandboxes (id),
    created_at BIGINT NOT NULL,
    PRIMARY KEY (namespace, alias)
);
