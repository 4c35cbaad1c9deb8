-- Tell the operator when a run mirrored from an AgentRun changes, so its status follows within a second.
-- Only rows linked to Kubernetes notify: runs made through the API pay nothing. Every step checkpoint
-- updates the run row in the same statement (tokens, lease), so step progress notifies too.
-- PostgreSQL folds identical notifications within one transaction; the operator debounces the rest.

CREATE FUNCTION agentrun_notify_run() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('{{RUN_CHANNEL}}', NEW.id::text);
    RETURN NULL;
END
$$;

CREATE TRIGGER run_notify
    AFTER INSERT OR UPDATE ON run
    FOR EACH ROW
    WHEN (NEW.k8s_name IS NOT NULL)
    EXECUTE FUNCTION agentrun_notify_run();
