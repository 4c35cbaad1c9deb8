-- Finding runs (issue 29). A run's labels: string -> string, Kubernetes label syntax (core/labels.py),
-- given at submission or mirrored from an AgentRun's metadata.labels; a continuation or fork starts with
-- its parent's. The runs list filters on them by label selector: the GIN index serves equality (`@>`)
-- and existence (`?`, `?&`, `?|`).
ALTER TABLE run ADD COLUMN labels JSONB NOT NULL DEFAULT '{}';
CREATE INDEX run_labels_idx ON run USING GIN (labels);

-- The list's other filters that a large table could not do without: by model, by parent (children,
-- continuations and forks; already its own query for sub-agents), by who created it.
CREATE INDEX run_model_idx ON run (model, created_at DESC);
CREATE INDEX run_created_by_idx ON run (created_by, created_at DESC) WHERE created_by IS NOT NULL;
CREATE INDEX run_parent_idx ON run (parent_run_id, created_at DESC) WHERE parent_run_id IS NOT NULL;

-- The workers at work (GET /api/workers). Each worker process upserts its row at start and on every
-- heartbeat, and deletes it when it stops cleanly; a killed one leaves its row behind, which readers skip
-- once `last_seen` is older than its own lease (its runs are then anyone's too). The runs it holds are
-- counted from the run table when read.
CREATE TABLE worker (
    id            TEXT PRIMARY KEY,
    version       TEXT NOT NULL,
    concurrency   INT NOT NULL,
    lease_seconds FLOAT8 NOT NULL CHECK (lease_seconds > 0),
    mcp_servers   TEXT[] NOT NULL DEFAULT '{}',
    started_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    last_seen     TIMESTAMPTZ NOT NULL DEFAULT now()
);
