-- The image a sandbox's runtime is made from, for backends that run images (Docker, I18).
-- Part of the binding with the backend: a live generation cannot change either.
ALTER TABLE sandboxes ADD COLUMN image TEXT;
