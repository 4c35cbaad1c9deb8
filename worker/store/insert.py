"""The one statement that inserts into `run`, and the row it takes: every new run is written by it, whichever
way it came in (runtime/door.py is that way; the architecture test holds both to it)."""

from __future__ import annotations

import uuid
from typing import Any

from agentrun.worker.core.records import NewRun
from agentrun.worker.core.tenants import tenant_problem
from agentrun.worker.core.text import unstorable

# A row of the statement, as jsonb_to_recordset reads it (run_row writes it).
RUN_ROW = """id uuid, input text, model text, system text, tools text[], token_budget bigint,
    cost_budget_usd numeric, max_steps int, timeout_seconds int, idempotency_key text, k8s_namespace text,
    k8s_name text, require_approval text[], output_schema jsonb, parent_run_id uuid, forked_at_seq int,
    created_by text, traceparent text, priority int, run_at timestamptz, delay_seconds float8, agent text,
    agent_version int, sub_agents text[], schedule_name text, scheduled_time timestamptz, webhook jsonb,
    context_management jsonb, labels jsonb, parent_tool_use_id text, root_run_id uuid, depth int, origin text,
    tenant text, replay_id uuid, replay_of uuid, tool_policy text"""

# The runs of the rows in %(runs)s (a JSON array), each made once: a run whose id, idempotency key or
# (parent, tool_use id) is taken already is left as it is (ON CONFLICT DO NOTHING); returns `{returning}` of
# each run made (of `r`, the new row): its id, or (store/submit.py, a batch) the whole run as a read returns it.
# `{gate}` is what the caller's statement joins and asks of each row: nothing for a run made alone; the
# parent's fence for a spawn (store/children.py), so a child is made only while its parent is held.
# The deadline counts from when the run becomes claimable: a run scheduled for tomorrow has its whole timeout
# from tomorrow; a time already past means at once. Children take the clock, not the transaction's start: they
# list in the order they were asked for.
INSERT_RUN = f"""INSERT INTO run AS r (id, input, model, system, tools, token_budget, cost_budget_usd, max_steps,
        timeout_seconds, deadline_at, idempotency_key, k8s_namespace, k8s_name, require_approval, output_schema,
        parent_run_id, forked_at_seq, created_by, traceparent, priority, run_at, agent, agent_version, sub_agents,
        schedule_name, scheduled_time, webhook, context_management, labels, parent_tool_use_id, root_run_id,
        depth, origin, tenant, replay_id, replay_of, tool_policy, created_at)
    SELECT n.id, n.input, n.model, n.system, n.tools, n.token_budget, n.cost_budget_usd, n.max_steps,
        n.timeout_seconds, at.run_at + make_interval(secs => n.timeout_seconds), n.idempotency_key, n.k8s_namespace,
        n.k8s_name, n.require_approval, n.output_schema, n.parent_run_id, n.forked_at_seq, n.created_by,
        n.traceparent, n.priority, at.run_at, n.agent, n.agent_version, n.sub_agents, n.schedule_name,
        n.scheduled_time, n.webhook, n.context_management, n.labels, n.parent_tool_use_id,
        n.root_run_id, n.depth, n.origin, n.tenant, n.replay_id, n.replay_of, n.tool_policy,
        CASE WHEN n.parent_tool_use_id IS NULL THEN now() ELSE clock_timestamp() END
    FROM jsonb_to_recordset(%(runs)s::jsonb) AS n ({RUN_ROW})
    CROSS JOIN LATERAL (
        SELECT greatest(now(), coalesce(n.run_at, now() + make_interval(secs => n.delay_seconds), now())) AS run_at
    ) AS at
    {{gate}}
    ON CONFLICT DO NOTHING
    RETURNING {{returning}}"""


def run_row(new: NewRun, parent: uuid.UUID | None = None) -> dict[str, Any]:
    """`new` as a row of INSERT_RUN; `parent` is the run whose call makes it a child (a spawn), else it is
    nobody's child, whatever `new.spawned_by` says. Raises ValueError naming the field if a text cannot be
    stored (a NUL character, a lone surrogate): the caller's input, refused whole rather than changed."""
    texts = {"input": new.input, "model": new.model, "system": new.system, "idempotency key": new.idempotency_key,
             **{f"tool name {t!r}": t for t in new.tools or ()}}
    for field, text in texts.items():
        if (why := unstorable(text)) is not None:
            raise ValueError(f"run {field} {why}")
    if (bad := tenant_problem(new.tenant)) is not None:
        raise ValueError(f"run {bad}")
    child = parent is not None and new.spawned_by is not None
    source = new.continue_from or (new.fork_from[0] if new.fork_from else None)
    return {
        "id": str(new.id or uuid.uuid4()), "input": new.input, "model": new.model, "system": new.system,
        "tools": _array(new.tools), "token_budget": new.token_budget,
        "cost_budget_usd": str(new.cost_budget_usd) if new.cost_budget_usd is not None else None,
        "max_steps": new.max_steps, "timeout_seconds": new.timeout_seconds, "idempotency_key": new.idempotency_key,
        "k8s_namespace": new.k8s_namespace, "k8s_name": new.k8s_name,
        "require_approval": _array(new.require_approval), "output_schema": new.output_schema,
        "parent_run_id": str(parent if child else source) if (child or source) else None,
        "forked_at_seq": new.fork_from[1] if new.fork_from else None, "created_by": new.created_by,
        "traceparent": new.traceparent, "priority": new.priority,
        "run_at": new.run_at.isoformat() if new.run_at is not None else None, "delay_seconds": new.delay_seconds,
        "agent": new.agent, "agent_version": new.agent_version, "sub_agents": _array(new.sub_agents),
        "schedule_name": new.schedule_name,
        "scheduled_time": new.scheduled_time.isoformat() if new.scheduled_time is not None else None,
        "webhook": new.webhook, "context_management": new.context_management, "labels": dict(new.labels),
        "parent_tool_use_id": new.spawned_by[1] if child and new.spawned_by else None,
        "root_run_id": str(new.root_run_id) if child and new.root_run_id else None,
        "depth": new.depth if child else 0, "origin": new.origin.value if new.origin is not None else None,
        "tenant": new.tenant, "replay_id": str(new.replay_id) if new.replay_id else None,
        "replay_of": str(new.replay_of) if new.replay_of else None, "tool_policy": new.tool_policy,
    }


def _array(values: tuple[str, ...] | None) -> list[str] | None:
    return list(values) if values is not None else None
