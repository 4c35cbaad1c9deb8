-- Schedules (issue 27): a run template started by the clock, by a 5-field cron expression in a time
-- zone or every `interval_seconds`. Exactly one run per tick across every worker and every crash: a
-- tick is a row of schedule_tick with the unique key (schedule, scheduled_time), inserted in the same
-- transaction as the run it creates.
CREATE TABLE schedule (
    name                      TEXT PRIMARY KEY CHECK (name ~ '^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$'),
    cron                      TEXT,
    interval_seconds          INT CHECK (interval_seconds >= 1),
    timezone                  TEXT NOT NULL DEFAULT 'UTC',
    run                       JSONB NOT NULL,  -- the run template as given (the API's `run`)
    spec                      JSONB NOT NULL,  -- the same, as the workers read it (core/schedules.py)
    concurrency_policy        TEXT NOT NULL DEFAULT 'Allow' CHECK (concurrency_policy IN ('Allow', 'Forbid', 'Replace')),
    starting_deadline_seconds INT NOT NULL DEFAULT 60 CHECK (starting_deadline_seconds >= 0),
    suspend                   BOOLEAN NOT NULL DEFAULT false,
    anchor                    TIMESTAMPTZ NOT NULL DEFAULT now(),  -- intervals count from here
    next_due_at               TIMESTAMPTZ,  -- the next tick not yet taken; NULL while suspended
    last_schedule_time        TIMESTAMPTZ,  -- the last tick that created a run
    last_error                TEXT,         -- why the last tick created no run, if it did not
    missed                    BIGINT NOT NULL DEFAULT 0,
    k8s_namespace             TEXT,
    k8s_name                  TEXT,
    created_at                TIMESTAMPTZ NOT NULL DEFAULT now(),
    created_by                TEXT,
    updated_at                TIMESTAMPTZ NOT NULL DEFAULT now(),
    CHECK ((cron IS NULL) <> (interval_seconds IS NULL))
);

-- The ticker's one statement when idle: the earliest due time.
CREATE INDEX schedule_due ON schedule (next_due_at) WHERE next_due_at IS NOT NULL;

-- One row per tick taken: `created` (its run is run_id), `skipped` (Forbid: a run of the schedule was
-- still active) or `missed` (past startingDeadlineSeconds, or an older tick of a catch-up).
CREATE TABLE schedule_tick (
    schedule_name  TEXT NOT NULL REFERENCES schedule (name) ON DELETE CASCADE,
    scheduled_time TIMESTAMPTZ NOT NULL,
    outcome        TEXT NOT NULL CHECK (outcome IN ('created', 'skipped', 'missed', 'failed')),
    run_id         UUID,
    created_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (schedule_name, scheduled_time)
);

ALTER TABLE run
    ADD COLUMN schedule_name  TEXT,
    ADD COLUMN scheduled_time TIMESTAMPTZ;

CREATE INDEX run_schedule ON run (schedule_name, created_at DESC) WHERE schedule_name IS NOT NULL;
