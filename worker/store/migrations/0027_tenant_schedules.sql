-- Schedules are their tenant's (issue 46): two tenants may each have a schedule of one name; its ticks make
-- runs of its tenant. Schedules made before tenants are 'default''s.
ALTER TABLE schedule ADD COLUMN tenant TEXT NOT NULL DEFAULT 'default';
ALTER TABLE schedule_tick ADD COLUMN tenant TEXT NOT NULL DEFAULT 'default';
ALTER TABLE schedule_tick DROP CONSTRAINT schedule_tick_schedule_name_fkey;
ALTER TABLE schedule_tick DROP CONSTRAINT schedule_tick_pkey;
ALTER TABLE schedule DROP CONSTRAINT schedule_pkey;
ALTER TABLE schedule ADD PRIMARY KEY (tenant, name);
ALTER TABLE schedule_tick ADD PRIMARY KEY (tenant, schedule_name, scheduled_time);
ALTER TABLE schedule_tick ADD CONSTRAINT schedule_tick_schedule_fkey
    FOREIGN KEY (tenant, schedule_name) REFERENCES schedule (tenant, name) ON DELETE CASCADE;
DROP INDEX run_schedule;
CREATE INDEX run_schedule ON run (tenant, schedule_name, created_at DESC) WHERE schedule_name IS NOT NULL;
