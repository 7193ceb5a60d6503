-- Starting and finishing a run is activity of its sandbox: keep last_active_at current in
-- the same transaction, instead of a separate write per run (idle reaping reads it).
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
