-- Live events (GET /api/runs/{id}/events): each run and step row remembers the transaction that last
-- changed what a watcher sees (event_xid), and every such change notifies `agentrun_events` with the
-- run id. The API re-reads the rows: the payload stays small, and a stream resumes from a position
-- (Last-Event-ID) because a row's event_xid only grows. The API only hands out rows whose transaction
-- is older than every transaction still in flight (pg_snapshot_xmin), so a transaction that started
-- earlier and commits later can never slip in behind a position already sent.

ALTER TABLE run ADD COLUMN event_xid xid8;
ALTER TABLE run_step ADD COLUMN event_xid xid8;

CREATE FUNCTION agentrun_event_mark() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.event_xid := pg_current_xact_id();
    RETURN NEW;
END
$$;

CREATE FUNCTION agentrun_event_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_TABLE_NAME = 'run' THEN
        PERFORM pg_notify('{{EVENTS_CHANNEL}}', NEW.id::text);
    ELSE
        PERFORM pg_notify('{{EVENTS_CHANNEL}}', NEW.run_id::text);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER run_step_event_mark BEFORE INSERT OR UPDATE ON run_step
    FOR EACH ROW EXECUTE FUNCTION agentrun_event_mark();
CREATE TRIGGER run_step_event_notify AFTER INSERT OR UPDATE ON run_step
    FOR EACH ROW EXECUTE FUNCTION agentrun_event_notify();

CREATE TRIGGER run_event_mark_insert BEFORE INSERT ON run
    FOR EACH ROW EXECUTE FUNCTION agentrun_event_mark();
-- Lease renewals (locked_until alone) change nothing a watcher sees: they neither mark nor notify.
CREATE TRIGGER run_event_mark BEFORE UPDATE ON run
    FOR EACH ROW WHEN ((OLD.status, OLD.tokens_used, OLD.cost_usd, OLD.cancel_requested, OLD.error, OLD.locked_by,
                        OLD.started_at, OLD.finished_at, OLD.deadline_at)
                       IS DISTINCT FROM
                       (NEW.status, NEW.tokens_used, NEW.cost_usd, NEW.cancel_requested, NEW.error, NEW.locked_by,
                        NEW.started_at, NEW.finished_at, NEW.deadline_at))
    EXECUTE FUNCTION agentrun_event_mark();
-- (A column list, UPDATE OF event_xid, would never fire: it looks at the SET list, not at what the
-- BEFORE trigger changed.)
CREATE TRIGGER run_event_notify_insert AFTER INSERT ON run
    FOR EACH ROW EXECUTE FUNCTION agentrun_event_notify();
CREATE TRIGGER run_event_notify AFTER UPDATE ON run
    FOR EACH ROW WHEN (NEW.event_xid IS DISTINCT FROM OLD.event_xid)
    EXECUTE FUNCTION agentrun_event_notify();

-- A decision on a pending call (migration 0008) changes the run's pending count and its tool call's
-- timeline row: marked and notified the same way.
ALTER TABLE run_decision ADD COLUMN event_xid xid8;
CREATE TRIGGER run_decision_event_mark BEFORE INSERT OR UPDATE ON run_decision
    FOR EACH ROW EXECUTE FUNCTION agentrun_event_mark();
CREATE TRIGGER run_decision_event_notify AFTER INSERT OR UPDATE ON run_decision
    FOR EACH ROW EXECUTE FUNCTION agentrun_event_notify();
