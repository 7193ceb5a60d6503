-- A run may be one execution of code in a code context's kernel (issue 36): `kind` takes
-- `code` besides `exec` and `process`. SQLite changes a column's CHECK only by rebuilding
-- the table: the same columns, rows, index and triggers, with the wider CHECK. No table
-- references `runs`, so nothing else moves.
CREATE TABLE runs_rebuilt (
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
    node_id           TEXT,
    kind              TEXT    NOT NULL DEFAULT 'exec' CHECK (kind IN ('exec', 'process', 'code')),
    tag               TEXT,
    pty               INTEGER NOT NULL DEFAULT 0 CHECK (pty IN (0, 1)),
    -- A run is finished exactly when it has a finish time, and failed exactly when it has a
    -- reason: a half-written outcome cannot be stored.
    CHECK ((status = 'running') = (finished_at IS NULL)),
    CHECK ((status = 'failed') = (failure_reason IS NOT NULL))
);

INSERT INTO runs_rebuilt (id, sandbox_id, generation, command, cwd, requested_by, status,
    started_at, finished_at, exit_code, signal, timed_out, duration_ms, cpu_user_ms,
    cpu_system_ms, peak_memory_bytes, failure_reason, node_id, kind, tag, pty)
SELECT id, sandbox_id, generation, command, cwd, requested_by, status,
    started_at, finished_at, exit_code, signal, timed_out, duration_ms, cpu_user_ms,
    cpu_system_ms, peak_memory_bytes, failure_reason, node_id, kind, tag, pty
FROM runs;

DROP TABLE runs;
ALTER TABLE runs_rebuilt RENAME TO runs;

CREATE INDEX runs_by_sandbox ON runs (sandbox_id, started_at, id);

CREATE TRIGGER runs_started_touch_sandbox AFTER INSERT ON runs
BEGIN
    UPDATE sandboxes SET last_active_at = MAX(last_active_at, NEW.started_at)
    WHERE id = NEW.sandbox_id;
END;

CREATE TRIGGER runs_finished_touch_sandbox AFTER UPDATE OF finished_at ON runs
WHEN NEW.finished_at IS NOT NULL
BEGIN
    UPDATE sandboxes SET last_active_at = MAX(last_active_at, NEW.finished_at)
    WHERE id = NEW.sandbox_id;
END;
