-- People in the loop and the run's answer: a run may wait for decisions (approvals, tool calls in doubt),
-- start from another run's conversation (continue, fork), and keep its final answer.

ALTER TABLE run DROP CONSTRAINT run_status_check;
ALTER TABLE run ADD CONSTRAINT run_status_check
    CHECK (status IN ('QUEUED', 'RUNNING', 'WAITING', 'SUCCEEDED', 'FAILED', 'CANCELLED', 'TIMED_OUT'));

ALTER TABLE run
    ADD COLUMN require_approval TEXT[],                   -- tools whose calls need a person's approval; '*': all
    ADD COLUMN output_schema    JSONB,                    -- the final answer must validate against it
    ADD COLUMN output           JSONB,                    -- the answer of a SUCCEEDED run: text, or the JSON value
    ADD COLUMN parent_run_id    UUID REFERENCES run (id), -- continued or forked from
    ADD COLUMN forked_at_seq    INT,                      -- a fork: the source's steps it starts with
    ADD COLUMN inherited_steps  INT NOT NULL DEFAULT 0;   -- steps copied from the parent (seq 1..n)

-- Waiting runs whose deadline passes are ended by whichever worker looks (no worker holds them).
CREATE INDEX run_waiting_idx ON run (deadline_at) WHERE status = 'WAITING';

ALTER TABLE run_step DROP CONSTRAINT run_step_kind_check;
ALTER TABLE run_step ADD CONSTRAINT run_step_kind_check CHECK (kind IN ('MODEL', 'TOOL', 'USER'));
ALTER TABLE run_step ADD COLUMN inherited BOOLEAN NOT NULL DEFAULT false;

-- One durable decision per tool call (and kind) that needs a person: pending while `decision` is NULL.
-- The first decision wins: decisions on one run are taken one at a time under the run's row lock.
CREATE TABLE run_decision (
    run_id      UUID NOT NULL REFERENCES run (id),
    tool_use_id TEXT NOT NULL,
    kind        TEXT NOT NULL CHECK (kind IN ('approval', 'in_doubt')),
    tool_name   TEXT NOT NULL,
    input       TEXT,                                     -- the call's input as JSON text
    since       TIMESTAMPTZ NOT NULL DEFAULT now(),
    position    INT NOT NULL DEFAULT 0,                   -- the call's place in its turn (the model's order)
    decision    TEXT CHECK (decision IN ('approve', 'deny', 'retry', 'record', 'fail')),
    output      TEXT,                                     -- record: what the call returned
    is_error    BOOLEAN NOT NULL DEFAULT false,
    reason      TEXT,
    decided_at  TIMESTAMPTZ,
    decided_by  TEXT,
    -- An approved call whose worker died while it ran may then be in doubt too: one row per kind.
    PRIMARY KEY (run_id, tool_use_id, kind)
);

-- A run whose last open decision is made is queued again: wake an idle worker at once.
CREATE TRIGGER run_requeued_wake AFTER UPDATE OF status ON run
    FOR EACH ROW WHEN (NEW.status = 'QUEUED' AND OLD.status = 'WAITING') EXECUTE FUNCTION agentrun_wake();
