-- The sandbox lifecycle as one state machine (issue 33): two states join, `pausing` (a
-- pause under way: no run starts) and `paused` (the runtime was snapshotted and ended; no
-- run starts until a resume); and what an owner may change at any time: `labels` (a JSON
-- object of strings), `deadline_at` (unix milliseconds, none when NULL) and `on_deadline`.
--
-- SQLite cannot change a CHECK constraint in place, and rebuilding `sandboxes` would drop
-- the table every run, lease and artifact references (foreign keys cannot be turned off
-- inside the transaction migrations run in). A constraint that only widens changes no
-- stored row, so the table's definition is edited where SQLite keeps it, as the SQLite
-- documentation describes for such changes (lang_altertable.html, "otheralter"); the
-- `ALTER TABLE` below then bumps the schema cookie, so every open connection reads the new
-- definition before its next statement.
PRAGMA writable_schema = ON;
UPDATE sqlite_master
SET sql = replace(sql,
    'CHECK (state IN (''created'', ''running'', ''stopped'', ''terminating'', ''terminated''))',
    'CHECK (state IN (''created'', ''running'', ''stopped'', ''pausing'', ''paused'', ''terminating'', ''terminated''))')
WHERE type = 'table' AND name = 'sandboxes';
PRAGMA writable_schema = RESET;
-- The edit must have matched the definition: otherwise this insert fails the migration.
CREATE TEMP TABLE lifecycle_migration_check (edited INTEGER NOT NULL CHECK (edited = 1));
INSERT INTO lifecycle_migration_check
SELECT instr(sql, '''pausing'', ''paused''') > 0 FROM sqlite_master
WHERE type = 'table' AND name = 'sandboxes';
DROP TABLE lifecycle_migration_check;

ALTER TABLE sandboxes ADD COLUMN labels TEXT NOT NULL DEFAULT '{}';
ALTER TABLE sandboxes ADD COLUMN deadline_at INTEGER;
ALTER TABLE sandboxes ADD COLUMN on_deadline TEXT NOT NULL DEFAULT 'terminate'
    CHECK (on_deadline IN ('terminate', 'pause'));
-- The deadline pass reads only sandboxes that have one.
CREATE INDEX sandboxes_by_deadline ON sandboxes (deadline_at) WHERE deadline_at IS NOT NULL;
