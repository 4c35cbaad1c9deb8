-- Who held each run when: one row per claim (a first claim or a takeover), written by the database
-- itself, so the record does not depend on the worker that is being audited. The chaos check uses it
-- to prove that every step was written by the worker holding the lease at that moment; operators use
-- it to see how often runs changed hands.

CREATE TABLE run_lease (
    run_id     UUID NOT NULL REFERENCES run (id),
    worker     TEXT NOT NULL,
    claimed_at TIMESTAMPTZ NOT NULL          -- the claiming statement's now(), the clock of step rows
);

CREATE INDEX run_lease_run_idx ON run_lease (run_id, claimed_at);

-- A claim is the only write that raises `claims`; renewals and fenced writes leave it alone.
CREATE FUNCTION run_lease_record() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO run_lease (run_id, worker, claimed_at) VALUES (NEW.id, NEW.locked_by, now());
    RETURN NULL;
END $$;

CREATE TRIGGER run_lease_on_claim
    AFTER UPDATE OF claims ON run
    FOR EACH ROW WHEN (NEW.claims > OLD.claims AND NEW.locked_by IS NOT NULL)
    EXECUTE FUNCTION run_lease_record();
