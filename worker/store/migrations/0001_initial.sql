-- The run and its append-only step log (the design document's two tables), with what the product adds:
-- cache token counts, cost, budgets, allowed tools, system prompt, times, and the Kubernetes link.

CREATE TABLE run (
    id               UUID PRIMARY KEY,
    status           TEXT NOT NULL DEFAULT 'QUEUED'
                     CHECK (status IN ('QUEUED', 'RUNNING', 'SUCCEEDED', 'FAILED', 'CANCELLED', 'TIMED_OUT')),
    input            TEXT NOT NULL,
    model            TEXT NOT NULL,
    system           TEXT,
    tools            TEXT[],                      -- NULL: every tool the worker has
    token_budget     BIGINT NOT NULL CHECK (token_budget > 0),
    tokens_used      BIGINT NOT NULL DEFAULT 0,
    cost_budget_usd  NUMERIC(14, 6) CHECK (cost_budget_usd > 0),
    cost_usd         NUMERIC(14, 6) NOT NULL DEFAULT 0,
    max_steps        INT NOT NULL DEFAULT 100 CHECK (max_steps > 0),
    timeout_seconds  INT NOT NULL CHECK (timeout_seconds > 0),
    deadline_at      TIMESTAMPTZ NOT NULL,
    run_at           TIMESTAMPTZ NOT NULL DEFAULT now(),
    locked_by        TEXT,
    locked_until     TIMESTAMPTZ,
    cancel_requested BOOLEAN NOT NULL DEFAULT false,
    error            TEXT,
    claims           INT NOT NULL DEFAULT 0,      -- how many times a worker took the run (1 + takeovers)
    idempotency_key  TEXT UNIQUE,                 -- the API's Idempotency-Key header
    k8s_namespace    TEXT,                        -- the AgentRun this run mirrors, if any
    k8s_name         TEXT,
    created_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    started_at       TIMESTAMPTZ,
    finished_at      TIMESTAMPTZ
);

-- Claiming scans only unfinished runs, oldest first.
CREATE INDEX run_claim_idx ON run (run_at) WHERE status IN ('QUEUED', 'RUNNING');
-- Listing: newest first, keyset pagination, optionally by status.
CREATE INDEX run_created_idx ON run (created_at DESC, id DESC);
CREATE INDEX run_status_created_idx ON run (status, created_at DESC, id DESC);
CREATE INDEX run_k8s_idx ON run (k8s_namespace, k8s_name) WHERE k8s_name IS NOT NULL;

CREATE TABLE run_step (
    run_id                      UUID NOT NULL REFERENCES run (id),
    seq                         INT NOT NULL,
    kind                        TEXT NOT NULL CHECK (kind IN ('MODEL', 'TOOL')),
    tool_name                   TEXT,
    tool_use_id                 TEXT,
    status                      TEXT NOT NULL CHECK (status IN ('STARTED', 'DONE', 'ERROR')),
    request                     TEXT,
    response                    TEXT,
    stop_reason                 TEXT,
    input_tokens                INT NOT NULL DEFAULT 0,
    output_tokens               INT NOT NULL DEFAULT 0,
    cache_creation_input_tokens INT NOT NULL DEFAULT 0,
    cache_read_input_tokens     INT NOT NULL DEFAULT 0,
    cost_usd                    NUMERIC(14, 6),           -- NULL: the model has no price
    latency_ms                  INT,
    attempts                    INT NOT NULL DEFAULT 1,   -- tool executions started under this key
    worker                      TEXT,                     -- the worker that wrote the step last
    started_at                  TIMESTAMPTZ NOT NULL DEFAULT now(),
    finished_at                 TIMESTAMPTZ,
    PRIMARY KEY (run_id, seq)
);

-- The idempotency key of a tool execution: the model's tool_use id, once per run.
CREATE UNIQUE INDEX step_tool_uk ON run_step (run_id, tool_use_id) WHERE kind = 'TOOL';
