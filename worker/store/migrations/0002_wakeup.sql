-- Wake idle workers at once when a run becomes claimable: a queued run is inserted, or a held run's
-- lease is given back (release sets locked_until to the past). Workers LISTEN on agentrun_wake and
-- still poll as the safety net. Identical notifications in one transaction are delivered once, so a
-- bulk insert wakes each worker once, not once per row.

CREATE FUNCTION agentrun_wake() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('{{WAKE_CHANNEL}}', '');
    RETURN NULL;
END
$$;

CREATE TRIGGER run_queued_wake AFTER INSERT ON run
    FOR EACH ROW WHEN (NEW.status = 'QUEUED') EXECUTE FUNCTION agentrun_wake();

-- Renewals and checkpoints only push locked_until forward; a shorter lease means it was handed back.
CREATE TRIGGER run_released_wake AFTER UPDATE OF locked_until ON run
    FOR EACH ROW WHEN (NEW.status = 'RUNNING' AND NEW.locked_until < OLD.locked_until)
    EXECUTE FUNCTION agentrun_wake();
