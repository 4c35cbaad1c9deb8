-- Operating a fleet: priorities and schedules, retention, and model rate limits shared by all workers.

-- Higher first among claimable runs; `run_at` (0001) already says from when a run is claimable.
ALTER TABLE run ADD COLUMN priority INT NOT NULL DEFAULT 0;

-- The claim walks this index in its order and stops at the first claimable row: a run whose time has
-- not come is skipped on the index entry itself (run_at is in it), without a visit to the table, so the
-- cost does not grow with the queue's depth. run_claim_idx (0001) stays: it finds the next scheduled
-- run_at for an idle worker's wake-up.
CREATE INDEX run_claim_priority_idx ON run (priority DESC, run_at) WHERE status IN ('QUEUED', 'RUNNING');

-- Pruning finds finished runs by when they finished, oldest first, a batch at a time.
CREATE INDEX run_finished_idx ON run (finished_at)
    WHERE status IN ('SUCCEEDED', 'FAILED', 'CANCELLED', 'TIMED_OUT');

-- Fleet-wide model limits (worker/llm/limits.py): one row per configured limit (a model name or glob),
-- changed by one statement per reservation. Rates are token buckets refilled continuously at
-- limit / 60 per second, up to a minute's worth; requests in flight are reservation ids with the time
-- by which they end at the latest, so a worker that dies mid-call frees its slots when they expire.
-- A 429 scales every limit of the row by `factor` until `tight_until` and pauses every call until
-- `paused_until`, for every worker at once.
CREATE TABLE model_limit (
    key          TEXT PRIMARY KEY,
    requests     FLOAT8 NOT NULL DEFAULT 0,         -- requests left in the bucket
    tokens       FLOAT8 NOT NULL DEFAULT 0,         -- tokens left in the bucket
    refilled_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    in_flight    JSONB NOT NULL DEFAULT '{}',       -- reservation id → epoch seconds it expires at
    factor       FLOAT8 NOT NULL DEFAULT 1 CHECK (factor > 0 AND factor <= 1),
    tight_until  TIMESTAMPTZ,
    paused_until TIMESTAMPTZ                        -- no call starts before (a 429's retry-after)
);
