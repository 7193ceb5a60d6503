-- Egress secrets and the egress audit (issue 38, I13, I22, I23).
--
-- `egress_secrets`: a credential warren's egress proxy presents for a sandbox, only to the
-- destinations its rule binds it to. `sandbox` is '' for the uid's own (every sandbox of
-- the uid), else the id of the one sandbox it belongs to; `rule` is the JSON of
-- warren_core::SecretRule (targets and presentation).
CREATE TABLE egress_secrets (
    uid        TEXT    NOT NULL,
    sandbox    TEXT    NOT NULL DEFAULT '',
    name       TEXT    NOT NULL,
    rule       TEXT    NOT NULL,
    value      TEXT    NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (uid, sandbox, name)
);

-- A sandbox's egress certificate authority, PEM: the first one stored is kept, so every
-- server agrees on it.
CREATE TABLE egress_authorities (
    sandbox    TEXT    NOT NULL PRIMARY KEY,
    cert       TEXT    NOT NULL,
    key        TEXT    NOT NULL,
    created_at INTEGER NOT NULL
);

-- The egress audit: one row per connection, `event` the JSON of warren_core::EgressEvent.
-- Ids only grow (AUTOINCREMENT never reuses one), so a reader's cursor stays valid while
-- the oldest rows are trimmed.
CREATE TABLE egress_events (
    id      INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT,
    sandbox TEXT    NOT NULL,
    at      INTEGER NOT NULL,
    event   TEXT    NOT NULL
);
CREATE INDEX egress_events_by_sandbox ON egress_events (sandbox, id);
