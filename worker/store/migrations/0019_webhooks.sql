-- Completion webhooks: a run may name a webhook; each status change it asks to hear of is written to an
-- outbox by a trigger, in the transaction of the change itself (whichever path makes it: a worker's
-- finish or park, a cancel, a deadline, housekeeping), so a crash neither loses nor invents a delivery.
-- Workers send them (runtime/webhooks.py) and record every attempt.

ALTER TABLE run ADD COLUMN webhook JSONB;  -- {"url", "events": ["finished", "waiting"], "secretRef"}
-- An agent's runs get its webhook unless their request names one.
ALTER TABLE agent_version ADD COLUMN webhook JSONB;

CREATE TABLE run_webhook (
    id          UUID PRIMARY KEY DEFAULT gen_random_uuid(),  -- the `webhook-id`, the same on every retry
    run_id      UUID NOT NULL REFERENCES run (id),
    event       TEXT NOT NULL CHECK (event IN ('finished', 'waiting')),
    run_status  TEXT NOT NULL,                               -- the status the run changed to
    url         TEXT NOT NULL,
    secret_ref  TEXT NOT NULL,
    state       TEXT NOT NULL DEFAULT 'PENDING' CHECK (state IN ('PENDING', 'DELIVERED', 'FAILED')),
    attempts    INT NOT NULL DEFAULT 0,                      -- attempts begun (a claim counts one)
    next_at     TIMESTAMPTZ NOT NULL DEFAULT now(),          -- due from then; while sending, the claim's lease
    claimed_by  TEXT,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    done_at     TIMESTAMPTZ,
    last_error  TEXT
);
CREATE INDEX run_webhook_due_idx ON run_webhook (next_at) WHERE state = 'PENDING';
CREATE INDEX run_webhook_run_idx ON run_webhook (run_id);

CREATE TABLE run_webhook_attempt (
    id           BIGSERIAL PRIMARY KEY,
    delivery_id  UUID NOT NULL REFERENCES run_webhook (id) ON DELETE CASCADE,
    run_id       UUID NOT NULL REFERENCES run (id),
    attempt      INT NOT NULL,
    worker       TEXT,
    started_at   TIMESTAMPTZ NOT NULL,
    status_code  INT,              -- the receiver's answer; NULL when there was none (refused, timed out)
    latency_ms   INT,
    error        TEXT              -- NULL for a 2xx
);
CREATE INDEX run_webhook_attempt_run_idx ON run_webhook_attempt (run_id, delivery_id, attempt);

CREATE FUNCTION agentrun_webhook_outbox() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    event TEXT := CASE WHEN NEW.status IN ('SUCCEEDED', 'FAILED', 'CANCELLED', 'TIMED_OUT') THEN 'finished'
                       WHEN NEW.status = 'WAITING' THEN 'waiting' END;
BEGIN
    IF event IS NOT NULL AND jsonb_typeof(NEW.webhook -> 'events') = 'array' AND (NEW.webhook -> 'events') ? event THEN
        INSERT INTO run_webhook (run_id, event, run_status, url, secret_ref)
        VALUES (NEW.id, event, NEW.status, NEW.webhook ->> 'url', coalesce(NEW.webhook ->> 'secretRef', ''));
        PERFORM pg_notify('{{WEBHOOK_CHANNEL}}', '');
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER run_webhook_outbox AFTER UPDATE OF status ON run
    FOR EACH ROW WHEN (NEW.webhook IS NOT NULL AND OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION agentrun_webhook_outbox();
