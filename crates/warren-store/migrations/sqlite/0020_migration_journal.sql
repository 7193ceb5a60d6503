-- The migration journal (I36): what a storage migrator (`warren migrate deerflow`) records
-- before and after every step of importing another system's files, so a rerun after a
-- crash resumes from here. A migration is written once with its plan and every item, under
-- the plan's digest; each item then moves through its steps by compare-and-set.
CREATE TABLE migrations (
    id          TEXT    NOT NULL PRIMARY KEY,
    kind        TEXT    NOT NULL,
    source      TEXT    NOT NULL,
    plan_digest TEXT    NOT NULL,
    -- The plan, JSON text as the migrator wrote it.
    plan        TEXT    NOT NULL,
    state       TEXT    NOT NULL CHECK (state IN ('planned', 'committed', 'cleaned')),
    created_at  INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL
);

CREATE TABLE migration_items (
    migration_id TEXT    NOT NULL REFERENCES migrations (id),
    key          TEXT    NOT NULL,
    kind         TEXT    NOT NULL,
    source       TEXT    NOT NULL,
    uid          TEXT,
    target       TEXT    NOT NULL,
    state        TEXT    NOT NULL
        CHECK (state IN ('planned', 'copied', 'verified', 'switched', 'committed', 'cleaned')),
    -- The SHA-256 of the item's tree manifest, from `copied` on.
    manifest     TEXT,
    files        INTEGER NOT NULL CHECK (files >= 0),
    bytes        INTEGER NOT NULL CHECK (bytes >= 0),
    updated_at   INTEGER NOT NULL,
    PRIMARY KEY (migration_id, key)
);
