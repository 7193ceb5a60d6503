-- The isolation tier a sandbox's runtimes run on (issue 19): `kernel` (the default, every
-- sandbox made before tiers existed) or `gvisor`. Part of the binding like the layout: a
-- live generation never changes its tier (I16), and a runtime of another tier is never
-- adopted for it.
ALTER TABLE sandboxes ADD COLUMN isolation TEXT NOT NULL DEFAULT 'kernel';
