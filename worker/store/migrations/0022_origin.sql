-- Which way a run came in (issue 45): `api` (POST /api/runs: a new run, a continuation or a fork),
-- `operator` (an AgentRun), `schedule` (a schedule's tick), `child` (a parent's sub-agent call). Every run
-- is made through one door (runtime/door.py), which records it here.
--
-- Runs made before keep NULL: filling it in would rewrite every row of the busiest table while the workers
-- write to it, to say what their other columns tell already (k8s_name, schedule_name, parent_tool_use_id).
-- For the same reason the check is NOT VALID: it holds every row written from now on, and reads no old one.
ALTER TABLE run ADD COLUMN origin TEXT;
ALTER TABLE run ADD CONSTRAINT run_origin_check
    CHECK (origin IN ('api', 'operator', 'schedule', 'child')) NOT VALID;
