-- Least-privilege PostgreSQL roles for agentrun (tested by tests/worker/test_database_role.py).
--
-- Two roles: agentrun_owner owns the schema and is used ONLY by `agentrun migrate` (a Job, an init
-- container, or a person); agentrun_runtime is what the workers and the operator use at run time: it
-- reads and writes the rows of runs, and can change nothing else. Neither is a superuser.
-- Replace the database name `agentrun` if yours differs, and set the passwords with \password.
-- In the chart, the owner's URL goes in the Secret named by `database.migrationSecret` (read only by
-- the migrate init containers) and the runtime role's in `database.existingSecret`.

-- [cluster] as a superuser, or a role with CREATEROLE and CREATEDB
CREATE ROLE agentrun_owner LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE;
CREATE ROLE agentrun_runtime LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT;
CREATE DATABASE agentrun OWNER agentrun_owner;
REVOKE ALL ON DATABASE agentrun FROM PUBLIC;
GRANT CONNECT ON DATABASE agentrun TO agentrun_runtime;

-- [database] connected to the agentrun database, as a superuser
-- Up to PostgreSQL 14 the schema public of a new database belongs to the bootstrap superuser (from 15 to
-- pg_database_owner): give it to the owner, which creates the tables in it, on every version alike.
ALTER SCHEMA public OWNER TO agentrun_owner;
REVOKE ALL ON SCHEMA public FROM PUBLIC;
GRANT USAGE ON SCHEMA public TO agentrun_runtime;

-- [after migrate] as agentrun_owner, after `agentrun migrate` (repeat when a migration adds a table)
-- No DELETE, TRUNCATE or DDL: runs and steps are never deleted by the runtime.
GRANT SELECT, INSERT, UPDATE ON run, run_step TO agentrun_runtime;
-- Written by the claim trigger, which runs with the rights of the claiming role; never read at run time.
GRANT INSERT ON run_lease TO agentrun_runtime;
-- Liveness suspicions (presence.py): recorded by the claiming worker, deleted by the suspected one.
GRANT SELECT, INSERT, DELETE ON worker_suspect TO agentrun_runtime;
-- The workers at work (migration 0021, GET /api/workers): each worker upserts its own row on its heartbeat
-- and deletes it when it stops; the API reads them.
GRANT SELECT, INSERT, UPDATE, DELETE ON worker TO agentrun_runtime;
-- Decisions on tool calls that need a person (approvals, calls in doubt): asked by workers, made via the API.
GRANT SELECT, INSERT, UPDATE ON run_decision TO agentrun_runtime;
-- Messages into running runs (migration 0015): stored via the API, marked delivered by workers.
GRANT SELECT, INSERT, UPDATE ON run_message TO agentrun_runtime;
-- Events from outside and their deliveries (migration 0017): posted via the API, received by workers'
-- waits; expired events are deleted by every worker's retention pass (AGENTRUN_EVENT_RETENTION).
GRANT SELECT, INSERT, UPDATE, DELETE ON run_event TO agentrun_runtime;
GRANT USAGE ON SEQUENCE run_event_id_seq TO agentrun_runtime;
GRANT SELECT, INSERT ON run_event_delivery TO agentrun_runtime;
-- Completion webhooks (migration 0019): the run table's trigger writes each delivery in the transaction of
-- the status change (so every role that changes a run's status needs INSERT); workers' senders claim and
-- update them and record each attempt; the API reads both.
GRANT SELECT, INSERT, UPDATE ON run_webhook TO agentrun_runtime;
GRANT SELECT, INSERT ON run_webhook_attempt TO agentrun_runtime;
GRANT USAGE ON SEQUENCE run_webhook_attempt_id_seq TO agentrun_runtime;
-- /readyz and `agentrun worker` (without --no-migrate) read the applied versions.
GRANT SELECT ON schema_migration TO agentrun_runtime;
-- Fleet-wide model limits (worker/llm/limits.py): one row per limit, reserved and freed by workers.
GRANT SELECT, INSERT, UPDATE ON model_limit TO agentrun_runtime;
-- Agent definitions (migration 0014): made and deleted via the API and the operator, read at submission.
GRANT SELECT, INSERT, UPDATE ON agent, agent_version TO agentrun_runtime;
-- Schedules (migration 0018): made, changed and deleted via the API and the operator; the workers' tickers
-- insert the ticks, advance the due times and prune ticks older than a day.
GRANT SELECT, INSERT, UPDATE, DELETE ON schedule, schedule_tick TO agentrun_runtime;
-- Tenants (migration 0023): a tenant's row is made with its first run, its quotas set via the API and the
-- CLI; the workers add what each tenant's model steps spent, and prune the minutes older than a day.
GRANT SELECT, INSERT, UPDATE ON tenant TO agentrun_runtime;
GRANT SELECT, INSERT, UPDATE, DELETE ON tenant_usage TO agentrun_runtime;
-- Replays (migration 0028): made via the API with their runs; their verdicts written as their runs finish
-- and scored again on demand.
GRANT SELECT, INSERT, UPDATE, DELETE ON replay, replay_result TO agentrun_runtime;
-- Live events (migration 0013): each transaction that changes a run, step or decision takes a position
-- from the sequence agentrun_event_position, which the migration grants to PUBLIC (a role made before
-- the upgrade goes on writing steps); nothing to grant here.

-- [retention] only if workers prune by themselves (--retention-days, chart value retention.days), as
-- agentrun_owner: the runtime role may then delete finished runs with their steps and lease history.
-- Without this section, run `agentrun prune --older-than 30d` as agentrun_owner (a CronJob, say).
GRANT DELETE ON run, run_step TO agentrun_runtime;
GRANT SELECT, DELETE ON run_lease TO agentrun_runtime;
GRANT DELETE ON run_decision TO agentrun_runtime;
GRANT DELETE ON run_message TO agentrun_runtime;
GRANT DELETE ON run_event_delivery TO agentrun_runtime;  -- its rows go with their run (ON DELETE CASCADE)
GRANT DELETE ON run_webhook, run_webhook_attempt TO agentrun_runtime;
