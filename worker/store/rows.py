"""What the run tables' rows are to the code: the columns read, the fence every write of a held run
starts with, and the records rows become."""

from __future__ import annotations

import dataclasses
from decimal import Decimal
from enum import Enum
from typing import Any

from agentrun.worker.core.errors import LeaseLost as LeaseLost
from agentrun.worker.core.records import (
    Decision,
    DecisionKind,
    PendingCall,
    Progress,
    Run,
    RunStatus,
    Step,
    StepKind,
    StepStatus,
)

# The descendants of run `r` still at work, through its running children (a finished child's finished
# descendants are in its own totals): what they have spent so far counts in `r`'s totals.
ACTIVE_DESCENDANTS = """WITH RECURSIVE t AS (
        SELECT c.id, c.tokens_used, c.cost_usd, c.children_tokens, c.children_cost FROM run c
        WHERE c.parent_run_id = r.id AND c.parent_tool_use_id IS NOT NULL
          AND c.status IN ('QUEUED', 'RUNNING', 'WAITING')
        UNION ALL
        SELECT c.id, c.tokens_used, c.cost_usd, c.children_tokens, c.children_cost
        FROM run c JOIN t ON c.parent_run_id = t.id
        WHERE c.parent_tool_use_id IS NOT NULL AND c.status IN ('QUEUED', 'RUNNING', 'WAITING'))
    SELECT * FROM t"""

RUN_COLUMNS = """r.id, r.status, r.input, r.model, r.system, r.tools, r.token_budget, r.tokens_used,
    r.cost_budget_usd, r.cost_usd, r.max_steps, r.timeout_seconds, r.deadline_at, r.cancel_requested,
    r.error, r.locked_by, r.locked_until, r.created_at, r.started_at, r.finished_at,
    r.idempotency_key, r.k8s_namespace, r.k8s_name, r.crashes, r.model_retries, r.created_by,
    r.cancelled_by, r.traceparent, r.priority, r.run_at,
    r.require_approval, r.output_schema, r.output, r.parent_run_id, r.forked_at_seq, r.inherited_steps,
    r.lease_epoch, r.messages_sent, r.messages_delivered, r.agent, r.agent_version, r.sub_agents,
    r.parent_tool_use_id, r.root_run_id, r.depth,
    r.children_active, r.children_tokens, r.children_cost, r.waiting_for, r.schedule_name, r.scheduled_time, r.webhook,
    r.context_management, r.labels, r.origin, r.tenant, r.throttled,
    r.replay_id, r.replay_of, r.tool_policy,
    CASE WHEN r.children_active > 0 THEN (SELECT row(coalesce(sum(t.tokens_used + t.children_tokens), 0),
                                                     coalesce(sum(t.cost_usd + t.children_cost), 0))
        FROM ({ACTIVE_DESCENDANTS}) t) END AS live,
    CASE WHEN r.status <> 'WAITING' THEN 0 WHEN r.waiting_for = 'children' THEN r.children_active
         WHEN r.waiting_for IN ('timer', 'event') THEN 1
         ELSE (SELECT count(*) FROM run_decision d WHERE d.run_id = r.id AND d.decision IS NULL) END AS pending,
    (SELECT coalesce(max(s.seq), 0) FROM run_step s WHERE s.run_id = r.id) AS steps""".replace(
    "{ACTIVE_DESCENDANTS}", ACTIVE_DESCENDANTS)

STEP_COLUMNS = """run_id, seq, kind, status, tool_name, tool_use_id, request, response, stop_reason,
    input_tokens, output_tokens, cache_creation_input_tokens, cache_read_input_tokens, cost_usd,
    latency_ms, attempts, worker, started_at, finished_at, inherited, created_by, recorded_seq"""

# A COMPACT step's bodies are small and say what the timeline shows of it (api/schemas.compaction_of).
TIMELINE_COLUMNS = STEP_COLUMNS.replace(
    "request, response,", "CASE WHEN kind = 'COMPACT' THEN request END AS request, "
    "CASE WHEN kind = 'COMPACT' THEN response END AS response,")

# The fence. `fence` locks the run row if and only if this worker still holds it under the claim the
# write was made for (its lease epoch: every claim counts one more); every other part of a fenced
# statement reads from it, so when it yields no row the worker lost the run and nothing is written.
# `owned` renews the lease (plus `extra`) and yields the counters for the guard. A NULL epoch (a caller
# outside the engine, such as a test) fences on the worker alone.
EPOCH = "(%(epoch)s::bigint IS NULL OR lease_epoch = %(epoch)s::bigint)"

FENCE = f"""fence AS (
    SELECT id FROM run WHERE id = %(id)s AND locked_by = %(worker)s AND status = 'RUNNING' AND {EPOCH}
    FOR UPDATE)"""

# The fence, with whether the run was asked to stop, read under the row lock: a cancel that committed while
# the write waited for the lock is seen here (every other read of a statement sees its older snapshot).
FENCE_ASKED = FENCE.replace("SELECT id FROM run", "SELECT id, cancel_requested FROM run")

OWNED = """owned AS (
    UPDATE run SET locked_until = now() + make_interval(secs => %(lease)s) {extra}
    FROM fence WHERE run.id = fence.id
    RETURNING run.id, run.tokens_used, run.cost_usd, run.cancel_requested, now() AS db_now,
        run.messages_sent - run.messages_delivered AS messages_waiting)"""


PROGRESS = "owned.tokens_used, owned.cost_usd, owned.cancel_requested, owned.db_now, owned.messages_waiting"


@dataclasses.dataclass(frozen=True)
class Claim:
    """A run a worker just claimed, and who held it before if it was taken over from another worker."""

    run: Run
    progress: Progress
    taken_from: str | None = None
    sent_at: float = 0.0
    """When the claim was sent, by time.monotonic(), once it had a connection: its lease cannot have begun
    earlier, nor later than the answer; the heartbeat counts the give-up mark from here (LeaseKeeper.hold)."""

    @property
    def fresh(self) -> bool:
        """Claimed QUEUED with no step: nothing to replay, and no holder that could be writing steps."""
        return self.taken_from is None and self.run.steps == 0


def as_run(row: dict[str, Any]) -> Run:
    row = dict(row)
    row["status"] = RunStatus(row["status"])
    row["tools"] = tuple(row["tools"]) if row["tools"] is not None else None
    if row.get("require_approval") is not None:
        row["require_approval"] = tuple(row["require_approval"])
    if row.get("sub_agents") is not None:
        row["sub_agents"] = tuple(row["sub_agents"])
    live = row.pop("live", None)
    if live is not None:  # (tokens, cost) of the descendants at work, as a record
        row["children_tokens_live"], row["children_cost_live"] = int(live[0]), Decimal(live[1])
    return Run(**row)


DECISION_COLUMNS = """run_id, tool_use_id, kind, tool_name, input, since, decision, output, is_error, reason,
    decided_at, decided_by, attempt"""


def as_pending(row: dict[str, Any]) -> PendingCall:
    row = dict(row)
    row["kind"] = DecisionKind(row["kind"])
    row["decision"] = Decision(row["decision"]) if row["decision"] is not None else None
    return PendingCall(**row)


class DecideOutcome(str, Enum):
    DECIDED = "decided"  # the decision was stored (and, if it was the last open one, the run queued again)
    NO_RUN = "no_run"
    NO_CALL = "no_call"  # the run has no pending call with that tool_use id
    WRONG_KIND = "wrong_kind"  # e.g. approve on a call in doubt
    ALREADY = "already"  # the call was decided before, or the run is no longer waiting


def as_step(row: dict[str, Any]) -> Step:
    row = dict(row)
    row["kind"] = StepKind(row["kind"])
    row["status"] = StepStatus(row["status"])
    return Step(**row)


def as_progress(row: dict[str, Any]) -> Progress:
    return Progress(row["tokens_used"], row["cost_usd"], row["cancel_requested"], row["db_now"],
                    row.get("messages_waiting") or 0)

