-- Live events held back only by transactions that write event rows (issue 24, item 5).
--
-- Until now a row's event_xid was its writer's transaction id, and the API sent only rows older than
-- every transaction still running (pg_snapshot_xmin): a cluster-wide horizon, so one idle transaction in
-- any database of the server (a report, a migration, a forgotten prepared transaction) stopped every
-- stream. Transaction ids cannot do better: a transaction that got its id from an unrelated write may
-- write an event row much later, below positions already sent.
--
-- Now a row's position (still in event_xid, which keeps its name and type so no table is rewritten and
-- ids stay comparable) comes from a sequence, taken when the transaction writes its first event row, and
-- every transaction that took one says so in pg_locks until it ends:
--   1. a shared transaction lock on the gate key, then
--   2. nextval (CACHE 1: handed out in order, so last_value bounds every value handed out), then
--   3. a shared transaction lock on the gate key + its position.
-- agentrun_event_horizon() reads last_value, then pg_locks (this database, those keys): every position
-- below the lowest one held, and below the next value, is final: its transaction ended, and every later
-- one takes a higher position. A transaction between steps 1 and 3 holds the gate without a position;
-- the horizon waits a moment for it. Nothing else holds the horizon back: not other databases, readers,
-- writers of other tables, nor prepared transactions (a transaction that wrote an event row cannot be
-- prepared at all: the notify triggers' NOTIFY forbids PREPARE TRANSACTION).
--
-- Keys: the one-bigint form of advisory locks (objsubid 1), 0x6576 ("ev") in the top 16 bits and the
-- position in the low 48: apart from the liveness locks (two-int form) and the migration and prune locks.
-- The gate is the key with position 0. Names in double braces: agentrun.worker.store.channels' constants.

-- Writers finish before the switch and start after it: no row written by the old trigger can commit
-- with a transaction id above the first position handed out.
LOCK TABLE run, run_step, run_decision IN SHARE ROW EXCLUSIVE MODE;

CREATE SEQUENCE agentrun_event_position AS bigint CACHE 1;
-- Above every transaction id handed out so far, so positions only grow across the upgrade and a client
-- resuming with an id from before it misses nothing.
SELECT setval('agentrun_event_position', pg_snapshot_xmax(pg_current_snapshot())::text::bigint);
-- Every role that writes runs takes positions, the runtime role of docs/database-role.sql included, and
-- one set up before this migration has no grant on a sequence that did not exist: without this, its
-- first step write after the upgrade would fail. A position says nothing about any run.
GRANT USAGE, SELECT ON SEQUENCE agentrun_event_position TO PUBLIC;

CREATE OR REPLACE FUNCTION agentrun_event_mark() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    -- One position per transaction: set_config(..., true) ends with the transaction (or with the
    -- subtransaction that rolls back, together with its locks).
    pos text := current_setting('agentrun.event_position', true);
BEGIN
    IF pos IS NULL OR pos = '' THEN
        PERFORM pg_advisory_xact_lock_shared({{EVENT_LOCK_GATE}});  -- the gate: 0x6576 << 48
        pos := nextval('agentrun_event_position')::text;
        PERFORM pg_advisory_xact_lock_shared({{EVENT_LOCK_GATE}} + pos::bigint);
        PERFORM set_config('agentrun.event_position', pos, true);
    END IF;
    NEW.event_xid := pos::xid8;
    RETURN NEW;
END
$$;

-- The lowest position that may still change: everything below it is committed and final. Two reads in
-- this order (the sequence, then the locks), which one statement could not promise.
CREATE FUNCTION agentrun_event_horizon() RETURNS bigint LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    next_position bigint;
    lowest bigint;
    between_steps boolean;
BEGIN
    FOR attempt IN 1..200 LOOP
        SELECT CASE WHEN is_called THEN last_value + 1 ELSE last_value END INTO next_position
            FROM agentrun_event_position;
        SELECT min(held.pos), coalesce(bool_or(held.gated AND held.pos IS NULL), false)
            INTO lowest, between_steps
            FROM (SELECT bool_or(key = {{EVENT_LOCK_GATE}} AND granted) AS gated,
                         min(key - {{EVENT_LOCK_GATE}}) FILTER (WHERE key <> {{EVENT_LOCK_GATE}}) AS pos
                  FROM (SELECT virtualtransaction, granted, (classid::bigint << 32) | objid::bigint AS key
                        FROM pg_locks
                        WHERE locktype = 'advisory' AND objsubid = 1 AND classid::bigint >> 16 = {{EVENT_LOCK_PREFIX}}
                          AND database = (SELECT oid FROM pg_database WHERE datname = current_database())) l
                  GROUP BY virtualtransaction) held;
        IF NOT between_steps THEN
            RETURN least(lowest, next_position);
        END IF;
        PERFORM pg_sleep(0.001);
    END LOOP;
    RETURN NULL;  -- a writer is slow between its steps (a loaded server): the caller asks again later
END
$$;
