-- Environment policy (I14). A sandbox either inherits the global sandbox environment and its
-- uid's agent environment or gets none of them; an ephemeral sandbox mounts a scratch
-- directory instead of its uid's persistent workspace. Both are part of the binding: a live
-- generation cannot change them.
ALTER TABLE sandboxes ADD COLUMN inherit_env INTEGER NOT NULL DEFAULT 1;
ALTER TABLE sandboxes ADD COLUMN ephemeral INTEGER NOT NULL DEFAULT 0;

-- A uid's agent environment: given to the commands of that uid's sandboxes that inherit it.
-- Secret values are masked in command output and no read API returns any value in full.
CREATE TABLE agent_env (
    uid TEXT NOT NULL,
    name TEXT NOT NULL,
    value TEXT NOT NULL,
    secret INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (uid, name)
);
