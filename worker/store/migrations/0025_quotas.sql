-- Tenants' quotas (issue 46, section 2): a tenant's quotas set through the API or the CLI are told from those
-- the chart seeds at start. (A submit over `max_queued` counts the tenant's QUEUED runs through 0024's
-- run_tenant_queued_idx.)

-- When the quotas were last set through the API or the CLI; NULL: never (made with a first run, or seeded
-- by the chart's `tenants.quotas`). The chart's quotas are applied at start only to tenants never set so:
-- a change made through the API wins over the chart's next rollout.
ALTER TABLE tenant ADD COLUMN configured_at TIMESTAMPTZ;
