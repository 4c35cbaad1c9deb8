-- Who did it: the identity that created a run and the one that first asked it to stop. An API
-- identity's name (AGENTRUN_API_TOKENS, `default` for AGENTRUN_API_TOKEN), `k8s:<namespace>/<user>`
-- or `k8s` for a run made from an AgentRun; NULL when the API was open or the row predates this.

ALTER TABLE run ADD COLUMN created_by TEXT;
ALTER TABLE run ADD COLUMN cancelled_by TEXT;
