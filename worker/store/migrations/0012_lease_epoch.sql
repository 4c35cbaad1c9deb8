-- A lease epoch, and handbacks that leave the run without a holder.

-- Every claim of a run counts one more epoch, and every fenced write names the epoch of the claim it
-- was made under. `locked_by` alone cannot tell two claims by the same worker apart: a write left over
-- from a driver that was stopped (drain, supersede, give-up) must not land once the same worker has
-- claimed the run again and replays it.
ALTER TABLE run ADD COLUMN lease_epoch BIGINT NOT NULL DEFAULT 0;

-- A handback (release, with or without a delay) now puts the run back QUEUED with no holder, so a
-- cancel ends it at once and its view shows no worker; `handed_back` stays set until the next claim,
-- so a copy of the release sent again finds it done under the same epoch. What a watcher sees of it
-- is when it will be tried again (run_at) and how many handbacks in a row (model_retries): marked
-- and notified like the other columns of 0010, as is the epoch a claim moves on.
DROP TRIGGER run_event_mark ON run;
CREATE TRIGGER run_event_mark BEFORE UPDATE ON run
    FOR EACH ROW WHEN ((OLD.status, OLD.tokens_used, OLD.cost_usd, OLD.cancel_requested, OLD.error, OLD.locked_by,
                        OLD.started_at, OLD.finished_at, OLD.deadline_at, OLD.run_at, OLD.model_retries,
                        OLD.lease_epoch)
                       IS DISTINCT FROM
                       (NEW.status, NEW.tokens_used, NEW.cost_usd, NEW.cancel_requested, NEW.error, NEW.locked_by,
                        NEW.started_at, NEW.finished_at, NEW.deadline_at, NEW.run_at, NEW.model_retries,
                        NEW.lease_epoch))
    EXECUTE FUNCTION agentrun_event_mark();

-- A handback wakes idle workers as before (0002 woke them on a shortened lease of a RUNNING run).
CREATE TRIGGER run_handed_back_wake AFTER UPDATE OF status ON run
    FOR EACH ROW WHEN (NEW.status = 'QUEUED' AND OLD.status = 'RUNNING') EXECUTE FUNCTION agentrun_wake();

-- Runs handed back under the old rule (RUNNING, a lapsed lease, handed_back) are queued the new way.
UPDATE run SET status = 'QUEUED', locked_by = NULL, locked_until = NULL
WHERE status = 'RUNNING' AND handed_back;
