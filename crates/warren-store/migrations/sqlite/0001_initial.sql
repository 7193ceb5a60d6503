-- warren state store, schema version 1 (SQLite).
--
-- Times are INTEGER unix milliseconds (UTC) so the same schema maps onto PostgreSQL BIGINT.
-- Enumerations are TEXT with CHECK constraints: the store refuses a value the code does not
-- know instead of letting it surface later as a corrupt record.

-- Workdirs created for a uid (idempotent record of `record_workdir`).
CREATE TABLE workdirs (
    uid        TEXT    NOT NULL,
    workdir    TEXT    NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (uid, workdir)
);

-- One row per (uid, runtime scope): the id is derived from both (I5). A terminated sandbox
-- keeps its row and is reused with a higher generation, so old runs stay attached to it.
CREATE TABLE sandboxes (
    id             TEXT    NOT NULL PRIMARY KEY,
    uid            TEXT    NOT NULL,
    runtime_scope  TEXT    NOT NULL,
    workdir        TEXT    NOT NULL,
    backend        TEXT    NOT NULL,
    state          TEXT    NOT NULL
        CHECK (state IN ('created', 'running', 'stopped', 'terminating', 'terminated')),
    generation     INTEGER NOT NULL CHECK (generation >= 1),
    created_at     INTEGER NOT NULL,
    last_active_at INTEGER NOT NULL,
    updated_at     INTEGER NOT NULL
);

CREATE INDEX sandboxes_by_uid ON sandboxes (uid);

-- One row per command run (I22): what ran, where, for whom, and how it ended.
CREATE TABLE runs (
    id                TEXT    NOT NULL PRIMARY KEY,
    sandbox_id        TEXT    NOT NULL REFERENCES sandboxes (id),
    generation        INTEGER NOT NULL,
    command           TEXT    NOT NULL,
    cwd               TEXT    NOT NULL,
    requested_by      TEXT    NOT NULL,
    status            TEXT    NOT NULL CHECK (status IN ('running', 'finished', 'failed')),
    started_at        INTEGER NOT NULL,
    finished_at       INTEGER,
    exit_code         INTEGER,
    signal            INTEGER,
    timed_out         INTEGER NOT NULL DEFAULT 0 CHECK (timed_out IN (0, 1)),
    duration_ms       INTEGER,
    cpu_user_ms       INTEGER,
    cpu_system_ms     INTEGER,
    peak_memory_bytes INTEGER,
    failure_reason    TEXT,
    -- A run is finished exactly when it has a finish time, and failed exactly when it has a
    -- reason: a half-written outcome cannot be stored.
    CHECK ((status = 'running') = (finished_at IS NULL)),
    CHECK ((status = 'failed') = (failure_reason IS NOT NULL))
);

CREATE INDEX runs_by_sandbox ON runs (sandbox_id, started_at);
