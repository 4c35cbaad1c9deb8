-- Tenants (issue 46): one fleet, many teams. Every run belongs to one: the tenant of the API identity that
-- submitted it, the tenant its AgentRun's namespace maps to, or its source's (a continuation, a fork, a
-- sub-agent, a schedule's tick). Runs made before tenants existed, and ways in that name none, are 'default'.
-- A constant default: adding the column rewrites no row.
ALTER TABLE run ADD COLUMN tenant TEXT NOT NULL DEFAULT 'default';

-- Why a QUEUED run is held back by its tenant's quota ({"quota", "until", "reason"}); NULL once a worker
-- takes it again. What `kubectl get agentruns` and the UI show of a run that waits for its tenant's budget.
ALTER TABLE run ADD COLUMN throttled JSONB;

-- An Idempotency-Key is scoped to its tenant: the same key from another tenant makes a run of its own.
ALTER TABLE run DROP CONSTRAINT run_idempotency_key_key;
CREATE UNIQUE INDEX run_tenant_idempotency_uk ON run (tenant, idempotency_key) WHERE idempotency_key IS NOT NULL;

-- A tenant's runs list, newest first.
CREATE INDEX run_tenant_created_idx ON run (tenant, created_at DESC, id DESC);

-- A tenant's quotas and share of the workers. NULL: no limit. The door makes a tenant's row when it first
-- makes one of its runs, so a claim can lock the tenants at a limit and count their running runs exactly,
-- and the fair share walks the tenants with work waiting.
CREATE TABLE tenant (
    name             TEXT PRIMARY KEY CHECK (name ~ '^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$'),  -- a DNS label
    max_running      INT CHECK (max_running >= 0),
    max_queued       INT CHECK (max_queued >= 0),
    tokens_per_day   BIGINT CHECK (tokens_per_day >= 0),
    cost_per_day_usd NUMERIC(16, 6) CHECK (cost_per_day_usd >= 0),
    weight           FLOAT8 NOT NULL DEFAULT 1 CHECK (weight > 0 AND weight <= 1000),
    created_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at       TIMESTAMPTZ NOT NULL DEFAULT now()
);
INSERT INTO tenant (name) VALUES ('default');

-- What each tenant's model steps spent, per minute and worker (each worker adds to its own row, so no two
-- workers wait on one hot row): the daily budgets sum the last 1,440 minutes.
CREATE TABLE tenant_usage (
    tenant   TEXT NOT NULL,
    minute   TIMESTAMPTZ NOT NULL,
    worker   TEXT NOT NULL,
    tokens   BIGINT NOT NULL DEFAULT 0,
    cost_usd NUMERIC(16, 6) NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, minute, worker)
);

-- Events are a tenant's too: one wakes only its tenant's waits, and its Idempotency-Key is its tenant's.
ALTER TABLE run_event ADD COLUMN tenant TEXT NOT NULL DEFAULT 'default';
ALTER TABLE run_event DROP CONSTRAINT run_event_idempotency_key_key;
CREATE UNIQUE INDEX run_event_tenant_idempotency_uk ON run_event (tenant, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
