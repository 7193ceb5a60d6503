-- Operator-allowed host directories a sandbox's runtimes show beside its layout's mounts
-- (DeerFlow's `extra_mounts`), as a JSON array of {target, root, beneath, writable}.
-- Part of the binding like the layout: a live generation never changes its view (I16).
ALTER TABLE sandboxes ADD COLUMN extra_mounts TEXT NOT NULL DEFAULT '[]';
