-- Sub-agents: a run's tool call may start a child run, once per (parent, tool_use id), and the parent waits
-- for the children of its turn without holding a lease.

ALTER TABLE run
    ADD COLUMN parent_tool_use_id TEXT,                    -- a child: the parent's call that started it
    ADD COLUMN root_run_id        UUID,                    -- a child: the top run of its tree (NULL: itself)
    ADD COLUMN depth              INT NOT NULL DEFAULT 0,  -- sub-agent calls between the root and this run
    ADD COLUMN children_active    INT NOT NULL DEFAULT 0,  -- children started and not finished yet
    ADD COLUMN children_tokens    BIGINT NOT NULL DEFAULT 0,           -- tokens of its finished descendants
    ADD COLUMN children_cost      NUMERIC(14, 6) NOT NULL DEFAULT 0,   -- and what they cost
    ADD COLUMN waiting_for        TEXT CHECK (waiting_for IN ('children'));  -- WAITING: why (NULL: decisions)

-- The database makes a child exactly once per call, whoever sends it and however often.
CREATE UNIQUE INDEX run_child_call_idx ON run (parent_run_id, parent_tool_use_id)
    WHERE parent_tool_use_id IS NOT NULL;
CREATE INDEX run_root_idx ON run (root_run_id) WHERE root_run_id IS NOT NULL;
-- The children whose parent has ended are cancelled by whichever worker looks (cascade, housekeeping).
CREATE INDEX run_active_child_idx ON run (parent_run_id)
    WHERE parent_tool_use_id IS NOT NULL AND status IN ('QUEUED', 'RUNNING', 'WAITING');

-- A child's end, whichever way it comes (its worker, a cancel, a deadline while it waited), is counted on
-- its parent under the parent's row lock: its tokens and cost join the parent's descendants' totals, and
-- the last child of a parent that waits for them queues it again (run_requeued_wake wakes a worker).
-- The parent's row carries the count, so the fenced write that parks the parent re-checks it on the row
-- itself: a child that ends while the parent is being parked is never missed. A finished child whose
-- own descendants end later passes their totals on.
CREATE FUNCTION agentrun_child_ended() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    ended BOOLEAN := NEW.status IN ('SUCCEEDED', 'FAILED', 'CANCELLED', 'TIMED_OUT')
                     AND OLD.status IN ('QUEUED', 'RUNNING', 'WAITING');
BEGIN
    IF ended THEN
        UPDATE run p SET children_active = greatest(p.children_active - 1, 0),
                         children_tokens = p.children_tokens + NEW.tokens_used + NEW.children_tokens,
                         children_cost = p.children_cost + NEW.cost_usd + NEW.children_cost,
                         status = CASE WHEN p.status = 'WAITING' AND p.waiting_for = 'children'
                                            AND p.children_active <= 1 THEN 'QUEUED' ELSE p.status END,
                         run_at = CASE WHEN p.status = 'WAITING' AND p.waiting_for = 'children'
                                            AND p.children_active <= 1 THEN now() ELSE p.run_at END,
                         waiting_for = CASE WHEN p.status = 'WAITING' AND p.waiting_for = 'children'
                                            AND p.children_active <= 1 THEN NULL ELSE p.waiting_for END
        WHERE p.id = NEW.parent_run_id;
    ELSIF NEW.children_tokens <> OLD.children_tokens OR NEW.children_cost <> OLD.children_cost THEN
        UPDATE run p SET children_tokens = p.children_tokens + (NEW.children_tokens - OLD.children_tokens),
                         children_cost = p.children_cost + (NEW.children_cost - OLD.children_cost)
        WHERE p.id = NEW.parent_run_id;
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER run_child_ended AFTER UPDATE ON run
    FOR EACH ROW WHEN (NEW.parent_tool_use_id IS NOT NULL AND (
        (OLD.status IN ('QUEUED', 'RUNNING', 'WAITING') AND NEW.status IN ('SUCCEEDED', 'FAILED', 'CANCELLED', 'TIMED_OUT'))
        OR (NEW.status IN ('SUCCEEDED', 'FAILED', 'CANCELLED', 'TIMED_OUT')
            AND (NEW.children_tokens, NEW.children_cost) IS DISTINCT FROM (OLD.children_tokens, OLD.children_cost))))
    EXECUTE FUNCTION agentrun_child_ended();
