-- The caller's W3C traceparent (version 00), given at submit: every worker that drives the run writes
-- its spans as children of that span. Without one a run's trace id is its own id, so nothing is stored.
ALTER TABLE run ADD COLUMN traceparent TEXT
    CONSTRAINT run_traceparent_format CHECK (traceparent ~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$');
