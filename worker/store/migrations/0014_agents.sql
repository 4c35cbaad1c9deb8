-- Agent definitions, versioned (issue 26): a name given once, run many times. Each change of definition
-- is a new version (from 1); a run names an agent and is pinned at submission to the version it got,
-- copied whole into the run row, so the engine never reads these tables for the run itself.

-- One row per name: the lock a new version is made under (two puts of one name serialise on it, so
-- they never make two equal versions), and the deletion mark (new runs refused; runs in flight finish;
-- versions stay, for the runs pinned to them). A new put undeletes.
CREATE TABLE agent (
    name       TEXT PRIMARY KEY CHECK (name ~ '^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$'),  -- a DNS label
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    deleted_at TIMESTAMPTZ
);

-- Every version of a definition, never changed. NULL: the definition leaves the field to the run.
CREATE TABLE agent_version (
    name             TEXT NOT NULL REFERENCES agent (name),
    version          INT NOT NULL CHECK (version >= 1),
    description      TEXT,                              -- what a parent's model reads of it as a sub-agent
    system           TEXT,
    model            TEXT,
    tools            TEXT[],
    require_approval TEXT[],
    output_schema    JSONB,
    max_steps        INT CHECK (max_steps >= 1),
    token_budget     BIGINT CHECK (token_budget >= 1),
    cost_budget_usd  NUMERIC(14, 6) CHECK (cost_budget_usd > 0),
    timeout_seconds  INT CHECK (timeout_seconds >= 1),
    sub_agents       TEXT[],                            -- as defined: `name` (the latest at submission) or `name@N`
    created_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    created_by       TEXT,
    PRIMARY KEY (name, version)
);

-- The agent a run was made from and its version (NULL: none), and its sub-agents pinned: `name@version`.
ALTER TABLE run
    ADD COLUMN agent         TEXT,
    ADD COLUMN agent_version INT,
    ADD COLUMN sub_agents    TEXT[];
