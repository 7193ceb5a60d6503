-- warren state store on PostgreSQL, schema version 1: the SQLite schema's 13 migrations as
-- one, with the same tables, columns and rules.
--
-- Times are BIGINT unix milliseconds (UTC), as on SQLite. Enumerations are TEXT with CHECK
-- constraints. Keys and names compare and sort bytewise (COLLATE "C") so that listings come
-- out in the same order as on SQLite, whatever the database's default collation.

CREATE TABLE workdirs (
    uid        TEXT COLLATE "C" NOT NULL,
    workdir    TEXT COLLATE "C" NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (uid, workdir)
);

-- One row per (uid, runtime scope) (I5); a terminated sandbox is reused with a higher
-- generation.
CREATE TABLE sandboxes (
    id             TEXT COLLATE "C" NOT NULL PRIMARY KEY,
    uid            TEXT COLLATE "C" NOT NULL,
    runtime_scope  TEXT NOT NULL,
    workdir        TEXT NOT NULL,
    backend        TEXT NOT NULL,
    state          TEXT NOT NULL
        CHECK (state IN ('created', 'running', 'stopped', 'terminating', 'terminated')),
    generation     BIGINT NOT NULL CHECK (generation >= 1),
    created_at     BIGINT NOT NULL,
    last_active_at BIGINT NOT NULL,
    updated_at     BIGINT NOT NULL,
    -- The network policy (I16): JSON of warren_core::NetworkPolicy.
    network        TEXT NOT NULL DEFAULT '{"mode":"none"}',
    -- Environment policy (I14).
    inherit_env    BOOLEAN NOT NULL DEFAULT TRUE,
    ephemeral      BOOLEAN NOT NULL DEFAULT FALSE,
    -- The snapshot a sandbox created "from_snapshot" starts from (I30).
    seed_snapshot  TEXT,
    -- The image of backends that run images (I18).
    image          TEXT
);
CREATE INDEX sandboxes_by_uid ON sandboxes (uid);

-- One row per command run (I22). `seq` orders runs started in the same millisecond, as
-- SQLite's rowid does.
CREATE TABLE runs (
    id                TEXT COLLATE "C" NOT NULL PRIMARY KEY,
    seq               BIGINT GENERATED ALWAYS AS IDENTITY,
    sandbox_id        TEXT COLLATE "C" NOT NULL REFERENCES sandboxes (id),
    generation        BIGINT NOT NULL,
    command           TEXT NOT NULL,
    cwd               TEXT NOT NULL,
    requested_by      TEXT NOT NULL,
    status            TEXT NOT NULL CHECK (status IN ('running', 'finished', 'failed')),
    started_at        BIGINT NOT NULL,
    finished_at       BIGINT,
    exit_code         INTEGER,
    signal            INTEGER,
    timed_out         BOOLEAN NOT NULL DEFAULT FALSE,
    duration_ms       BIGINT,
    cpu_user_ms       BIGINT,
    cpu_system_ms     BIGINT,
    peak_memory_bytes BIGINT,
    failure_reason    TEXT,
    CHECK ((status = 'running') = (finished_at IS NULL)),
    CHECK ((status = 'failed') = (failure_reason IS NOT NULL))
);
CREATE INDEX runs_by_sandbox ON runs (sandbox_id, started_at);
CREATE INDEX runs_running ON runs (status) WHERE status = 'running';

-- Starting and finishing a run is activity of its sandbox, kept current in the same
-- transaction (idle reaping reads it).
CREATE FUNCTION runs_touch_sandbox() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE sandboxes
    SET last_active_at = GREATEST(last_active_at, COALESCE(NEW.finished_at, NEW.started_at))
    WHERE id = NEW.sandbox_id;
    RETURN NULL;
END;
$$;
CREATE TRIGGER runs_started_touch_sandbox AFTER INSERT ON runs
    FOR EACH ROW EXECUTE FUNCTION runs_touch_sandbox();
CREATE TRIGGER runs_finished_touch_sandbox AFTER UPDATE OF finished_at ON runs
    FOR EACH ROW WHEN (NEW.finished_at IS NOT NULL) EXECUTE FUNCTION runs_touch_sandbox();

-- Leases (I25).
CREATE TABLE leases (
    id         TEXT COLLATE "C" PRIMARY KEY,
    sandbox_id TEXT COLLATE "C" NOT NULL REFERENCES sandboxes (id),
    generation BIGINT NOT NULL,
    holder     TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL
);
CREATE INDEX leases_by_sandbox ON leases (sandbox_id, expires_at);

-- A uid's agent environment (I14).
CREATE TABLE agent_env (
    uid        TEXT COLLATE "C" NOT NULL,
    name       TEXT COLLATE "C" NOT NULL,
    value      TEXT NOT NULL,
    secret     BOOLEAN NOT NULL,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (uid, name)
);

-- Artifacts (I26).
CREATE TABLE artifacts (
    id         TEXT COLLATE "C" PRIMARY KEY,
    sandbox_id TEXT COLLATE "C" NOT NULL REFERENCES sandboxes (id),
    uid        TEXT COLLATE "C" NOT NULL,
    path       TEXT NOT NULL,
    size       BIGINT NOT NULL,
    sha256     TEXT NOT NULL,
    media_type TEXT NOT NULL,
    created_at BIGINT NOT NULL
);
CREATE INDEX artifacts_by_sandbox ON artifacts (sandbox_id, created_at);
CREATE INDEX artifacts_by_uid ON artifacts (uid, created_at);

-- Workdir checkpoints (I28).
CREATE TABLE checkpoints (
    id         TEXT COLLATE "C" PRIMARY KEY,
    sandbox_id TEXT COLLATE "C" NOT NULL REFERENCES sandboxes (id),
    workdir    TEXT NOT NULL,
    manifest   TEXT NOT NULL,
    files      BIGINT NOT NULL,
    bytes      BIGINT NOT NULL,
    created_at BIGINT NOT NULL
);
CREATE INDEX checkpoints_by_sandbox ON checkpoints (sandbox_id, created_at);

-- Skills granted from the operator's catalog (I32).
CREATE TABLE skill_grants (
    uid        TEXT COLLATE "C" NOT NULL,
    slug       TEXT COLLATE "C" NOT NULL,
    granted_at BIGINT NOT NULL,
    PRIMARY KEY (uid, slug)
);

-- Snapshot chunks and manifests kept in the state store (I31), namespaced by owner.
CREATE TABLE snapshot_objects (
    owner      TEXT COLLATE "C" NOT NULL,
    key        TEXT COLLATE "C" NOT NULL,
    bytes      BYTEA NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (owner, key)
);

-- Runtime snapshots (I30).
CREATE TABLE runtime_snapshots (
    id            TEXT COLLATE "C" PRIMARY KEY,
    sandbox_id    TEXT COLLATE "C" NOT NULL REFERENCES sandboxes (id),
    generation    BIGINT NOT NULL,
    cow_manifest  TEXT NOT NULL,
    home_manifest TEXT NOT NULL,
    bytes         BIGINT NOT NULL,
    reason        TEXT NOT NULL,
    created_at    BIGINT NOT NULL
);
CREATE INDEX runtime_snapshots_by_sandbox ON runtime_snapshots (sandbox_id, created_at);

-- Execution guards (issue 13): the row outlives every holder so its token only grows.
-- Expiry is judged by the database's clock (clock_timestamp()), the same for every
-- replica.
CREATE TABLE guards (
    sandbox_id  TEXT COLLATE "C" NOT NULL PRIMARY KEY REFERENCES sandboxes (id),
    token       BIGINT NOT NULL CHECK (token >= 1),
    holder      TEXT NOT NULL,
    acquired_at BIGINT NOT NULL,
    expires_at  BIGINT NOT NULL,
    -- The lifetime of the last grant or renewal: what a renewal naming none extends by.
    ttl_ms      BIGINT NOT NULL CHECK (ttl_ms >= 0)
);
