-- The sandbox lifecycle as one state machine (issue 33): two states join, `pausing` (a
-- pause under way: no run starts) and `paused` (the runtime was snapshotted and ended; no
-- run starts until a resume); and what an owner may change at any time: `labels` (a JSON
-- object of strings), `deadline_at` (unix milliseconds, none when NULL) and `on_deadline`.
ALTER TABLE sandboxes DROP CONSTRAINT sandboxes_state_check;
ALTER TABLE sandboxes ADD CONSTRAINT sandboxes_state_check
    CHECK (state IN ('created', 'running', 'stopped', 'pausing', 'paused', 'terminating',
                     'terminated'));
ALTER TABLE sandboxes ADD COLUMN labels TEXT NOT NULL DEFAULT '{}';
ALTER TABLE sandboxes ADD COLUMN deadline_at BIGINT;
ALTER TABLE sandboxes ADD COLUMN on_deadline TEXT NOT NULL DEFAULT 'terminate'
    CHECK (on_deadline IN ('terminate', 'pause'));
-- The reaper's deadline pass reads only sandboxes that have one.
CREATE INDEX sandboxes_by_deadline ON sandboxes (deadline_at) WHERE deadline_at IS NOT NULL;
