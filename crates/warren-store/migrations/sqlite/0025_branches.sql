-- Branches of a workdir (issue 37, I27): a named, writable view over a read-only baseline.
-- `id` names its storage in the data directory; `checkpoint` is the checkpoint it was made
-- from (its baseline is then that checkpoint's tree, not the workdir); `merged_at` is when a
-- merge brought it into its workdir (it is never merged again). A sandbox bound to a branch
-- records its name beside its workdir: part of its binding, like the workdir.
CREATE TABLE branches (
    uid        TEXT    NOT NULL,
    workdir    TEXT    NOT NULL,
    name       TEXT    NOT NULL,
    id         TEXT    NOT NULL UNIQUE,
    checkpoint TEXT,
    created_at INTEGER NOT NULL,
    merged_at  INTEGER,
    PRIMARY KEY (uid, workdir, name)
);
ALTER TABLE sandboxes ADD COLUMN branch TEXT;
