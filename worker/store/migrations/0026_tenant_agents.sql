-- Agents are their tenant's (issue 46): two tenants may each have an agent of one name, and a run (or a
-- sub-agent call) finds its agent among its own tenant's only. Agents made before tenants are 'default''s.
ALTER TABLE agent ADD COLUMN tenant TEXT NOT NULL DEFAULT 'default';
ALTER TABLE agent_version ADD COLUMN tenant TEXT NOT NULL DEFAULT 'default';
ALTER TABLE agent_version DROP CONSTRAINT agent_version_name_fkey;
ALTER TABLE agent_version DROP CONSTRAINT agent_version_pkey;
ALTER TABLE agent DROP CONSTRAINT agent_pkey;
ALTER TABLE agent ADD PRIMARY KEY (tenant, name);
ALTER TABLE agent_version ADD PRIMARY KEY (tenant, name, version);
ALTER TABLE agent_version ADD CONSTRAINT agent_version_agent_fkey
    FOREIGN KEY (tenant, name) REFERENCES agent (tenant, name);
