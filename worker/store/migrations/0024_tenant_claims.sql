-- The claim by tenant (issue 46): each tenant's next queued runs, in its own order, and its running runs,
-- counted, so a claim can share the workers among tenants by weight and hold each to its max_running.

-- A tenant's queued runs in claim order: the claim takes each tenant's first few through this (a LATERAL
-- per tenant), so a tenant with 20,000 queued costs it no more than one with 5.
CREATE INDEX run_tenant_queued_idx ON run (tenant, priority DESC, run_at) WHERE status = 'QUEUED';

-- A tenant's running runs: counted under the tenant's lock against its max_running, and its place in the
-- fair share. Small: only what the fleet holds now.
CREATE INDEX run_tenant_running_idx ON run (tenant) WHERE status = 'RUNNING';

-- A run of a tenant at its limit is claimable by time but skipped, so idle workers have no wake-up for it
-- (0002 wakes on a new or handed-back run): when a limited tenant's run stops running (ends, or parks
-- WAITING) and it has runs queued, wake them, so its next run starts now rather than at the next poll.
-- Handed back (RUNNING to QUEUED) already wakes them (0012).
CREATE FUNCTION agentrun_wake_slot_freed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM tenant WHERE name = NEW.tenant AND max_running IS NOT NULL)
       AND EXISTS (SELECT 1 FROM run WHERE tenant = NEW.tenant AND status = 'QUEUED') THEN
        PERFORM pg_notify('{{WAKE_CHANNEL}}', '');
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER run_slot_freed_wake AFTER UPDATE OF status ON run
    FOR EACH ROW WHEN (OLD.status = 'RUNNING' AND NEW.status NOT IN ('RUNNING', 'QUEUED'))
    EXECUTE FUNCTION agentrun_wake_slot_freed();

-- A limit raised or lifted frees slots too.
CREATE TRIGGER tenant_limit_raised_wake AFTER UPDATE OF max_running ON tenant
    FOR EACH ROW WHEN (OLD.max_running IS NOT NULL AND (NEW.max_running IS NULL OR NEW.max_running > OLD.max_running))
    EXECUTE FUNCTION agentrun_wake();
