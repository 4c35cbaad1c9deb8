-- Durable timers and waits for outside events: a run parked WAITING for a time or an event key holds no
-- lease; one sweep per worker wakes the due ones, and POST /api/events wakes the ones waiting on its key.

ALTER TABLE run DROP CONSTRAINT run_waiting_for_check;
ALTER TABLE run ADD CONSTRAINT run_waiting_for_check CHECK (waiting_for IN ('children', 'timer', 'event'));

ALTER TABLE run
    ADD COLUMN wake_at          TIMESTAMPTZ,  -- a timer: when it fires; an event wait: when it times out
    ADD COLUMN wait_key         TEXT,         -- an event wait: the key (NULL: a timer)
    ADD COLUMN wait_tool_use_id TEXT,         -- the call the wait answers (its tool_use id)
    ADD COLUMN wait_since       TIMESTAMPTZ;  -- when the wait began

-- The sweep's one statement finds the due waits through this index alone, however many runs sleep.
CREATE INDEX run_wake_idx ON run (wake_at) WHERE status = 'WAITING' AND waiting_for IN ('timer', 'event');
-- An event finds the runs waiting on its key.
CREATE INDEX run_wait_key_idx ON run (wait_key) WHERE status = 'WAITING' AND waiting_for = 'event';

-- An event names a fact: kept for AGENTRUN_EVENT_RETENTION, delivered to every wait on its key that
-- begins within it. A POST's Idempotency-Key and its answer are stored with the event, in one transaction.
CREATE TABLE run_event (
    id              BIGSERIAL PRIMARY KEY,
    key             TEXT NOT NULL,
    payload         JSONB,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    created_by      TEXT,
    idempotency_key TEXT UNIQUE,
    answer          JSONB NOT NULL DEFAULT '{}'   -- what the POST answered: {"woke": [...]}
);
CREATE INDEX run_event_key_idx ON run_event (key, id);
CREATE INDEX run_event_created_idx ON run_event (created_at);

-- Each event at most once to each run, and each wait call answered by one event.
CREATE TABLE run_event_delivery (
    run_id       UUID NOT NULL REFERENCES run (id) ON DELETE CASCADE,
    event_id     BIGINT NOT NULL,
    tool_use_id  TEXT NOT NULL,
    payload      JSONB,
    delivered_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, event_id),
    UNIQUE (run_id, tool_use_id)
);
