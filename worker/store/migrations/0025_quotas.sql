-- Tenants' quotas (issue 46, section 2): a submit counts its tenant's queued runs, and a tenant's quotas
-- set through the API or the CLI are told from those the chart seeds at start.

-- A tenant's QUEUED runs (scheduled and handed-back ones included): what a submit over `max_queued`
-- counts, under the tenant row's lock. Only the queued ones: a tenant's finished runs cost it nothing.
CREATE INDEX run_tenant_queued_idx ON run (tenant) WHERE status = 'QUEUED';

-- When the quotas were last set through the API or the CLI; NULL: never (made with a first run, or seeded
-- by the chart's `tenants.quotas`). The chart's quotas are applied at start only to tenants never set so:
-- a change made through the API wins over the chart's next rollout.
ALTER TABLE tenant ADD COLUMN configured_at TIMESTAMPTZ;
