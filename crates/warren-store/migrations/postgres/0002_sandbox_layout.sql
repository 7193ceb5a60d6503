-- What a sandbox's runtime looks like from inside (I7): `ars` (the default, every sandbox
-- made before layouts existed) or `deerflow`. Part of the binding: a live generation
-- never changes its view (I16).
ALTER TABLE sandboxes ADD COLUMN layout TEXT NOT NULL DEFAULT 'ars';
