-- A run may be one execution of code in a code context's kernel (issue 36): `kind` takes
-- `code` besides `exec` and `process`.
ALTER TABLE runs DROP CONSTRAINT runs_kind_check;
ALTER TABLE runs ADD CONSTRAINT runs_kind_check CHECK (kind IN ('exec', 'process', 'code'));
