-- Context-window management (issue 28). A run (and an agent's version, for its runs) may say how its
-- conversation is kept within the model's window: {"strategy", "triggerTokens"?, "keepRecentTurns"?}
-- (core/context.py); NULL is the default, {"strategy": "auto"}.
ALTER TABLE run ADD COLUMN context_management JSONB;
ALTER TABLE agent_version ADD COLUMN context_management JSONB;

-- A COMPACT step: the engine summarised the turns before a point (a model call of its own, its tokens and
-- cost counted), or cleared old tool results (no call). Its `request` says what it covers; replay sends its
-- summary (or the placeholders) in place of those turns from then on. Every original step stays.
ALTER TABLE run_step DROP CONSTRAINT run_step_kind_check;
ALTER TABLE run_step ADD CONSTRAINT run_step_kind_check CHECK (kind IN ('MODEL', 'TOOL', 'USER', 'COMPACT'));
