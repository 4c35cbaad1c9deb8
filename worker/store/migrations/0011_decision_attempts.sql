-- A decision authorises one execution: each decision on a call names the attempt it was asked at (the
-- executions of the call already started then: 0 for an approval, run_step.attempts of the STARTED step
-- for a call in doubt) and authorises the next one only. A call interrupted again is asked again, so one
-- call has as many in-doubt rows as it was interrupted; every row is kept, in order, with who decided.
ALTER TABLE run_decision ADD COLUMN attempt INT NOT NULL DEFAULT 0 CHECK (attempt >= 0);

-- Rows from before: an open question was asked at the step's attempts as they are now (nothing ran
-- since); a `retry` taken is counted as used up (attempt one below the step's), so a call still STARTED
-- after it is asked again rather than run again on a decision that may already have been spent.
UPDATE run_decision d SET attempt = greatest(s.attempts - CASE WHEN d.decision = 'retry' THEN 1 ELSE 0 END, 1)
FROM run_step s
WHERE d.kind = 'in_doubt' AND s.run_id = d.run_id AND s.kind = 'TOOL' AND s.tool_use_id = d.tool_use_id;
UPDATE run_decision SET attempt = 1 WHERE kind = 'in_doubt' AND attempt = 0;

ALTER TABLE run_decision DROP CONSTRAINT run_decision_pkey;
ALTER TABLE run_decision ADD PRIMARY KEY (run_id, tool_use_id, kind, attempt);
ALTER TABLE run_decision ADD CONSTRAINT run_decision_attempt_kind_check
    CHECK ((kind = 'approval') = (attempt = 0));
