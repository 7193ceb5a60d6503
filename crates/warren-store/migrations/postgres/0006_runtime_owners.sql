-- One owner per runtime (issue 14): which node may start, exec in, snapshot or destroy a
-- sandbox's runtime, at which epoch of that node, and the fencing token that grows at
-- every change of owner. `node_id` NULL: nobody owns it (released, or never claimed:
-- token 0). Runs record the node that executed them, so recovery closes only its own.
CREATE TABLE runtime_owners (
    sandbox_id TEXT COLLATE "C" PRIMARY KEY,
    node_id TEXT,
    epoch BIGINT NOT NULL,
    token BIGINT NOT NULL,
    since BIGINT NOT NULL
);
CREATE INDEX runtime_owners_by_node ON runtime_owners (node_id);
ALTER TABLE runs ADD COLUMN node_id TEXT;
