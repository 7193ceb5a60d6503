-- A sandbox's network policy is part of its binding (I16): JSON of warren_core::NetworkPolicy.
ALTER TABLE sandboxes ADD COLUMN network TEXT NOT NULL DEFAULT '{"mode":"none"}';
