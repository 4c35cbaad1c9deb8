-- Messages into a running run (issue 26, part 3): POST /api/runs/{id}/messages.
--
-- A message is stored at once (run_message) and delivered at the run's next turn boundary as a USER
-- step (run_step.kind 'USER', request 'message'), in the order received (n). Two counters on the run
-- row itself say whether any is owed: `messages_sent` is counted up by the statement that stores a
-- message, in the same UPDATE that checks the run is not finished, and `messages_delivered` by the
-- write that appends its USER step. The write that ends a run SUCCEEDED is fenced on
-- messages_sent = messages_delivered: both sides lock and re-check the run row, so under READ
-- COMMITTED a message accepted with 202 is either delivered or refused (409), never lost to a run that
-- succeeds without it. (A subquery on run_message would not do: a concurrent UPDATE's re-check sees
-- the run row's new version but not rows committed meanwhile in another table.)
ALTER TABLE run
    ADD COLUMN messages_sent      INT NOT NULL DEFAULT 0,
    ADD COLUMN messages_delivered INT NOT NULL DEFAULT 0;

CREATE TABLE run_message (
    run_id     UUID NOT NULL REFERENCES run (id),
    n          INT NOT NULL,            -- 1, 2, ... per run: the order received (run.messages_sent then)
    text       TEXT NOT NULL,
    created_by TEXT,                    -- the API identity that sent it (null on an open API)
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    seq        INT,                     -- the USER step that delivered it; null until then
    write_id   UUID,                    -- the delivering write: a copy of it sent again finds its steps
    PRIMARY KEY (run_id, n)
);
CREATE INDEX run_message_undelivered ON run_message (run_id, n) WHERE seq IS NULL;

-- Who wrote a USER step that is a person's message (the timeline and the events show it as createdBy).
ALTER TABLE run_step ADD COLUMN created_by TEXT;

-- A watcher sees a message counted when it is posted and when it is delivered: the run's change mark
-- (0010, 0012) covers the two counters too. The same columns as 0012's, and the two.
DROP TRIGGER run_event_mark ON run;
CREATE TRIGGER run_event_mark BEFORE UPDATE ON run
    FOR EACH ROW WHEN ((OLD.status, OLD.tokens_used, OLD.cost_usd, OLD.cancel_requested, OLD.error, OLD.locked_by,
                        OLD.started_at, OLD.finished_at, OLD.deadline_at, OLD.run_at, OLD.model_retries,
                        OLD.lease_epoch, OLD.messages_sent, OLD.messages_delivered)
                       IS DISTINCT FROM
                       (NEW.status, NEW.tokens_used, NEW.cost_usd, NEW.cancel_requested, NEW.error, NEW.locked_by,
                        NEW.started_at, NEW.finished_at, NEW.deadline_at, NEW.run_at, NEW.model_retries,
                        NEW.lease_epoch, NEW.messages_sent, NEW.messages_delivered))
    EXECUTE FUNCTION agentrun_event_mark();
