-- Replays (issue 47): recorded runs run again against a change (a model, a system prompt, tools, an agent
-- version), their tool calls answered from the recording, and the difference reported.
--
-- A replay: what was asked (`request`, the POST body as normalised), how its runs' tool calls are served
-- (`tool_policy`), and how a replayed run is judged against its recording (`scorer`). An Idempotency-Key
-- names the first replay of its tenant made with it: a retry gets that one, not a second.
CREATE TABLE replay (
    id UUID PRIMARY KEY,
    tenant TEXT NOT NULL,
    created_by TEXT,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    request JSONB NOT NULL,
    tool_policy TEXT NOT NULL CHECK (tool_policy IN ('recorded', 'recorded_then_live_readonly')),
    scorer TEXT NOT NULL,
    from_seq INT,  -- the replay runs keep the recorded steps before it, and diverge from there
    idempotency_key TEXT,
    UNIQUE (tenant, idempotency_key)
);

-- One verdict per replay run, written once the run has finished and been compared with its recording.
CREATE TABLE replay_result (
    replay_id UUID NOT NULL REFERENCES replay (id) ON DELETE CASCADE,
    replay_run_id UUID NOT NULL,
    recorded_run_id UUID NOT NULL,
    pass BOOLEAN,  -- NULL: not scored (yet)
    diff JSONB NOT NULL,
    scored_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (replay_id, replay_run_id)
);

-- A replay run: the replay it is part of, the recorded run it replays, and its replay's tool policy (read by
-- the engine with the run, so serving a call needs no other row). NULL on every other run. The runs are made
-- by the door with the replay row, in its transaction; a run of a replay that was deleted keeps its ids (no
-- foreign key: a run outlives what asked for it, as a schedule's runs outlive the schedule).
ALTER TABLE run ADD COLUMN replay_id UUID;
ALTER TABLE run ADD COLUMN replay_of UUID;
ALTER TABLE run ADD COLUMN tool_policy TEXT;
CREATE INDEX run_replay ON run (replay_id) WHERE replay_id IS NOT NULL;

-- A TOOL step served from the recording rather than run: the seq of the recorded run's step whose result it
-- got. NULL on every step that ran.
ALTER TABLE run_step ADD COLUMN recorded_seq INT;

-- A replay's runs come in by a way of their own. NOT VALID as in 0022_origin.sql: the check holds every row
-- written from now on and reads no old one.
ALTER TABLE run DROP CONSTRAINT run_origin_check;
ALTER TABLE run ADD CONSTRAINT run_origin_check
    CHECK (origin IN ('api', 'operator', 'schedule', 'child', 'replay')) NOT VALID;
