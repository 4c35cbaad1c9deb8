-- Engine hardening: liveness that survives a connection blip, writes that can be retried, cancels that
-- interrupt, outages that hand runs back instead of failing them, and poison runs that end.

-- A worker whose liveness lock another worker found free, and since when (the database's clock). A run
-- is taken over from a live lease only once its holder has stayed without its lock for a grace period:
-- a live worker whose presence connection dropped takes its lock again within it and deletes its row,
-- so a connection blip never hands its runs to another worker. A SIGKILLed worker never comes back.
CREATE TABLE worker_suspect (
    worker TEXT PRIMARY KEY,
    since  TIMESTAMPTZ NOT NULL DEFAULT now()
);

ALTER TABLE run
    -- Claims after which the previous holder had not handed the run back (it died or lost its lease
    -- mid-step). Bounded, so a step that kills every worker that runs it ends the run instead.
    ADD COLUMN crashes INT NOT NULL DEFAULT 0,
    -- Set when a worker gives the run back at a checkpoint (release), cleared by the next claim.
    ADD COLUMN handed_back BOOLEAN NOT NULL DEFAULT false,
    -- Consecutive model steps that ran out of retries on a retryable error (an API outage): the
    -- backoff before the run is claimable again grows with it; a model step that succeeds resets it.
    ADD COLUMN model_retries INT NOT NULL DEFAULT 0;

-- The identity of the write that made or last changed a step, kept across retries of that one write,
-- so a write whose outcome was lost with its connection is retried without being applied twice.
ALTER TABLE run_step ADD COLUMN write_id UUID;

-- Tell the worker holding a run at once that it was asked to stop, so it interrupts the step in flight.
CREATE FUNCTION agentrun_notify_cancel() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('{{CANCEL_CHANNEL}}', NEW.id::text);
    RETURN NULL;
END
$$;

CREATE TRIGGER run_cancel_notify
    AFTER UPDATE OF cancel_requested ON run
    FOR EACH ROW WHEN (NEW.cancel_requested AND NOT OLD.cancel_requested AND NEW.status = 'RUNNING')
    EXECUTE FUNCTION agentrun_notify_cancel();
