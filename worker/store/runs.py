"""The run table and its step log. Every write to a held run is fenced: it names the worker and the
RUNNING status in its WHERE clause, and zero rows means the lease is gone (`LeaseLost`).

Each write is ONE statement (data-modifying CTEs), atomic by itself; it renews the lease and returns
the run's counters for the guard. The writes of held runs go through group commit (groupcommit.py):
alone when nothing else is queued, else with the other runs' writes in one transaction and one round
trip, where the three writes every step makes share one statement per kind (CHECKPOINTS, TOOL_STARTS,
TOOL_FINISHES), each run in it fenced on its own.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping, Sequence
from decimal import Decimal
from enum import Enum
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from agentrun.worker.core.errors import LeaseLost as LeaseLost
from agentrun.worker.core.records import (
    Decision,
    DecisionKind,
    NewRun,
    PendingCall,
    Progress,
    Run,
    RunStatus,
    Step,
    StepKind,
    StepStatus,
)
from agentrun.worker.core.text import clean, unstorable
from agentrun.worker.store.groupcommit import GroupCommit, Shared

# A continued or forked run starts with the steps of its parent, copied and marked inherited: replay
# needs nothing else, and the parent may be pruned later without breaking its child. A continuation
# copies every step and adds the new input as a USER step of its own; a conversation that began as the
# parent's `input` gets that input as a USER step first. A fork copies the first `fork_seq` steps. Tool
# steps left STARTED are copied too: their call is in doubt in the new run as it was in its parent (a call
# of an idempotent tool simply runs again), and the new run asks its own people, not the parent's
# decisions, before it runs one again. So is a STARTED step just past a fork's last step whose call the
# fork still owes (no model or user step between): a fork at the model step that asked for a call in
# doubt must not make that call again unasked. A continuation goes on from a SUCCEEDED run, which owes
# nothing: its STARTED rows, if any, are history only.
_INHERIT = b"""
WITH parent AS (SELECT id, input FROM run WHERE id = %(parent)s),
opening AS (
    SELECT p.input FROM parent p
    WHERE %(fork_seq)s::int IS NULL
      AND NOT EXISTS (SELECT 1 FROM run_step s WHERE s.run_id = p.id AND s.seq = 1 AND s.kind = 'USER')),
copied AS (
    SELECT s.* FROM run_step s JOIN parent p ON s.run_id = p.id
    WHERE %(fork_seq)s::int IS NULL OR s.seq <= %(fork_seq)s
       OR (s.kind = 'TOOL' AND s.status = 'STARTED'
           AND NOT EXISTS (SELECT 1 FROM run_step t WHERE t.run_id = p.id AND t.kind <> 'TOOL'
                           AND t.seq > %(fork_seq)s AND t.seq < s.seq))),
shift AS (SELECT count(*)::int AS n FROM opening),
steps AS (
    INSERT INTO run_step (run_id, seq, kind, status, tool_name, tool_use_id, request, response, stop_reason,
        input_tokens, output_tokens, cache_creation_input_tokens, cache_read_input_tokens, cost_usd, latency_ms,
        attempts, worker, started_at, finished_at, inherited)
    SELECT %(id)s, 1, 'USER', 'DONE', NULL, NULL, NULL, o.input, NULL, 0, 0, 0, 0, NULL, NULL, 1, NULL, now(), now(),
           true FROM opening o
    UNION ALL
    SELECT %(id)s, (SELECT n FROM shift) + row_number() OVER (ORDER BY c.seq), c.kind, c.status, c.tool_name,
           c.tool_use_id, c.request, c.response, c.stop_reason, c.input_tokens, c.output_tokens,
           c.cache_creation_input_tokens, c.cache_read_input_tokens, c.cost_usd, c.latency_ms, c.attempts,
           c.worker, c.started_at, c.finished_at, true
    FROM copied c
    RETURNING seq),
own AS (
    INSERT INTO run_step (run_id, seq, kind, status, response, started_at, finished_at)
    SELECT %(id)s, (SELECT count(*) FROM steps) + 1, 'USER', 'DONE', %(input)s, now(), now()
    WHERE %(fork_seq)s::int IS NULL
    RETURNING seq)
UPDATE run SET inherited_steps = (SELECT count(*) FROM steps) WHERE id = %(id)s
"""


RUN_COLUMNS = """r.id, r.status, r.input, r.model, r.system, r.tools, r.token_budget, r.tokens_used,
    r.cost_budget_usd, r.cost_usd, r.max_steps, r.timeout_seconds, r.deadline_at, r.cancel_requested,
    r.error, r.locked_by, r.locked_until, r.created_at, r.started_at, r.finished_at,
    r.idempotency_key, r.k8s_namespace, r.k8s_name, r.crashes, r.model_retries, r.created_by,
    r.cancelled_by, r.traceparent, r.priority, r.run_at,
    r.require_approval, r.output_schema, r.output, r.parent_run_id, r.forked_at_seq, r.inherited_steps,
    r.lease_epoch,
    CASE WHEN r.status = 'WAITING' THEN (SELECT count(*) FROM run_decision d
         WHERE d.run_id = r.id AND d.decision IS NULL) ELSE 0 END AS pending,
    (SELECT coalesce(max(s.seq), 0) FROM run_step s WHERE s.run_id = r.id) AS steps"""

STEP_COLUMNS = """run_id, seq, kind, status, tool_name, tool_use_id, request, response, stop_reason,
    input_tokens, output_tokens, cache_creation_input_tokens, cache_read_input_tokens, cost_usd,
    latency_ms, attempts, worker, started_at, finished_at, inherited"""

TIMELINE_COLUMNS = STEP_COLUMNS.replace("request, response,", "NULL AS request, NULL AS response,")

# The fence. `fence` locks the run row if and only if this worker still holds it under the claim the
# write was made for (its lease epoch: every claim counts one more); every other part of a fenced
# statement reads from it, so when it yields no row the worker lost the run and nothing is written.
# `owned` renews the lease (plus `extra`) and yields the counters for the guard. A NULL epoch (a caller
# outside the engine, such as a test) fences on the worker alone.
EPOCH = "(%(epoch)s::bigint IS NULL OR lease_epoch = %(epoch)s::bigint)"

FENCE = f"""fence AS (
    SELECT id FROM run WHERE id = %(id)s AND locked_by = %(worker)s AND status = 'RUNNING' AND {EPOCH}
    FOR UPDATE)"""

OWNED = """owned AS (
    UPDATE run SET locked_until = now() + make_interval(secs => %(lease)s) {extra}
    FROM fence WHERE run.id = fence.id
    RETURNING run.id, run.tokens_used, run.cost_usd, run.cancel_requested, now() AS db_now)"""

# First key of every worker's liveness lock (the second is hashtext(worker id)), held by the worker's
# presence connection (presence.py): it keeps them apart from any other advisory lock in the database.
LIVENESS_LOCK_CLASS = 0x61675274  # "agRt"

PROGRESS = "owned.tokens_used, owned.cost_usd, owned.cancel_requested, owned.db_now"


# The shared forms of the three writes every step makes (groupcommit.py): one statement for the copies
# of many runs. `w` has a row per run; `fence` locks, in id order, those still held by the worker that
# sent its row; every other part joins it, so a run whose lease is gone gets no row back and nothing
# written, whatever happens to the others. Each reads and writes as its one-run form above does.
SHARED_FENCE = """fence AS (
    SELECT run.id FROM run JOIN w ON run.id = w.id AND run.locked_by = w.worker
    WHERE run.status = 'RUNNING' AND (w.epoch IS NULL OR run.lease_epoch = w.epoch)
    ORDER BY run.id FOR UPDATE OF run)"""

SHARED_PROGRESS = "owned.id, owned.tokens_used, owned.cost_usd, owned.cancel_requested, owned.db_now"

CHECKPOINTS = Shared("checkpoint_model", f"""
WITH w AS (
    SELECT * FROM unnest(%(id)s::uuid[], %(worker)s::text[], %(epoch)s::bigint[], %(lease)s::float8[],
        %(wid)s::uuid[], %(request)s::text[], %(response)s::text[], %(stop)s::text[], %(in)s::int[], %(out)s::int[],
        %(cw)s::int[], %(cr)s::int[], %(cost)s::numeric[], %(ms)s::int[])
    AS w (id, worker, epoch, lease, wid, request, response, stop, i, o, cw, cr, cost, ms)),
{SHARED_FENCE},
done AS (SELECT s.run_id AS id, s.seq FROM run_step s JOIN w ON s.run_id = w.id AND s.write_id = w.wid),
step AS (
    INSERT INTO run_step (run_id, seq, kind, status, request, response, stop_reason,
        input_tokens, output_tokens, cache_creation_input_tokens, cache_read_input_tokens,
        cost_usd, latency_ms, worker, started_at, finished_at, write_id)
    SELECT w.id, (SELECT coalesce(max(s.seq), 0) + 1 FROM run_step s WHERE s.run_id = w.id),
        'MODEL', 'DONE', w.request, w.response, w.stop, w.i, w.o, w.cw, w.cr, w.cost, w.ms, w.worker,
        now() - make_interval(secs => w.ms / 1000.0), now(), w.wid
    FROM w JOIN fence USING (id) WHERE NOT EXISTS (SELECT 1 FROM done WHERE done.id = w.id)
    RETURNING run_id AS id, seq,
        input_tokens + output_tokens + cache_creation_input_tokens + cache_read_input_tokens AS tokens, cost_usd),
owned AS (
    UPDATE run SET locked_until = now() + make_interval(secs => w.lease),
        tokens_used = run.tokens_used + coalesce(step.tokens, 0),
        cost_usd = run.cost_usd + coalesce(step.cost_usd, 0), model_retries = 0
    FROM w JOIN fence USING (id) LEFT JOIN step USING (id) WHERE run.id = w.id
    RETURNING run.id, run.tokens_used, run.cost_usd, run.cancel_requested, now() AS db_now)
SELECT coalesce(step.seq, done.seq) AS seq, {SHARED_PROGRESS}
FROM owned LEFT JOIN step USING (id) LEFT JOIN done USING (id)""".encode(),
    ("id", "worker", "epoch", "lease", "wid", "request", "response", "stop", "in", "out", "cw", "cr", "cost", "ms"))

TOOL_STARTS = Shared("start_tool", f"""
WITH w AS (
    SELECT * FROM unnest(%(id)s::uuid[], %(worker)s::text[], %(epoch)s::bigint[], %(lease)s::float8[],
        %(wid)s::uuid[], %(tuid)s::text[], %(name)s::text[], %(request)s::text[])
    AS w (id, worker, epoch, lease, wid, tuid, name, request)),
{SHARED_FENCE},
done AS (SELECT s.run_id AS id, s.seq, s.attempts FROM run_step s JOIN w ON s.run_id = w.id
         WHERE s.kind = 'TOOL' AND s.tool_use_id = w.tuid AND s.write_id = w.wid AND s.status = 'STARTED'),
step AS (
    INSERT INTO run_step (run_id, seq, kind, tool_name, tool_use_id, status, request, worker, write_id)
    SELECT w.id, (SELECT coalesce(max(s.seq), 0) + 1 FROM run_step s WHERE s.run_id = w.id),
        'TOOL', w.name, w.tuid, 'STARTED', w.request, w.worker, w.wid
    FROM w JOIN fence USING (id) WHERE NOT EXISTS (SELECT 1 FROM done WHERE done.id = w.id)
    ON CONFLICT (run_id, tool_use_id) WHERE kind = 'TOOL'
    DO UPDATE SET attempts = run_step.attempts + 1, worker = EXCLUDED.worker,
                  started_at = now(), write_id = EXCLUDED.write_id
    WHERE run_step.status = 'STARTED' AND run_step.write_id IS DISTINCT FROM EXCLUDED.write_id
    RETURNING run_id AS id, seq, attempts),
owned AS (
    UPDATE run SET locked_until = now() + make_interval(secs => w.lease)
    FROM w JOIN fence USING (id) WHERE run.id = w.id
    RETURNING run.id, run.tokens_used, run.cost_usd, run.cancel_requested, now() AS db_now)
SELECT coalesce(step.seq, done.seq) AS seq, coalesce(step.attempts, done.attempts) AS attempts, {SHARED_PROGRESS}
FROM owned LEFT JOIN step USING (id) LEFT JOIN done USING (id)""".encode(),
    ("id", "worker", "epoch", "lease", "wid", "tuid", "name", "request"))

TOOL_FINISHES = Shared("finish_tool", f"""
WITH w AS (
    SELECT * FROM unnest(%(id)s::uuid[], %(worker)s::text[], %(epoch)s::bigint[], %(lease)s::float8[],
        %(wid)s::uuid[], %(tuid)s::text[], %(status)s::text[], %(output)s::text[], %(ms)s::int[])
    AS w (id, worker, epoch, lease, wid, tuid, status, output, ms)),
{SHARED_FENCE},
step AS (
    UPDATE run_step SET status = w.status, response = w.output, latency_ms = w.ms, worker = w.worker,
                        finished_at = now(), write_id = w.wid
    FROM w JOIN fence USING (id)
    WHERE run_step.run_id = w.id AND run_step.kind = 'TOOL' AND run_step.tool_use_id = w.tuid
      AND (run_step.status = 'STARTED' OR run_step.write_id = w.wid)
    RETURNING run_step.run_id AS id, run_step.seq),
owned AS (
    UPDATE run SET locked_until = now() + make_interval(secs => w.lease)
    FROM w JOIN fence USING (id) WHERE run.id = w.id
    RETURNING run.id, run.tokens_used, run.cost_usd, run.cancel_requested, now() AS db_now)
SELECT step.seq, {SHARED_PROGRESS} FROM owned LEFT JOIN step USING (id)""".encode(),
    ("id", "worker", "epoch", "lease", "wid", "tuid", "status", "output", "ms"))



@dataclasses.dataclass(frozen=True)
class Claim:
    """A run a worker just claimed, and who held it before if it was taken over from another worker."""

    run: Run
    progress: Progress
    taken_from: str | None = None

    @property
    def fresh(self) -> bool:
        """Claimed QUEUED with no step: nothing to replay, and no holder that could be writing steps."""
        return self.taken_from is None and self.run.steps == 0


def _run(row: dict[str, Any]) -> Run:
    row = dict(row)
    row["status"] = RunStatus(row["status"])
    row["tools"] = tuple(row["tools"]) if row["tools"] is not None else None
    if row.get("require_approval") is not None:
        row["require_approval"] = tuple(row["require_approval"])
    return Run(**row)


DECISION_COLUMNS = """run_id, tool_use_id, kind, tool_name, input, since, decision, output, is_error, reason,
    decided_at, decided_by, attempt"""


def _pending(row: dict[str, Any]) -> PendingCall:
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


def _step(row: dict[str, Any]) -> Step:
    row = dict(row)
    row["kind"] = StepKind(row["kind"])
    row["status"] = StepStatus(row["status"])
    return Step(**row)


def _progress(row: dict[str, Any]) -> Progress:
    return Progress(row["tokens_used"], row["cost_usd"], row["cancel_requested"], row["db_now"])


class RunStore:
    """`writes` sends the fenced writes of held runs; by default they are group-committed (groupcommit.py)."""

    def __init__(
        self, pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]], writes: GroupCommit | None = None
    ) -> None:
        self.pool = pool
        self.writes = writes or GroupCommit(pool)

    async def dedicated_connection(self) -> psycopg.AsyncConnection[Any]:
        """A connection of its own, with the pool's settings, for a session that outlives any one query."""
        conninfo_source, kwargs_source = self.pool.conninfo, self.pool.kwargs
        conninfo = conninfo_source() if callable(conninfo_source) else conninfo_source
        if not isinstance(conninfo, str):
            conninfo = await conninfo
        kwargs = kwargs_source() if callable(kwargs_source) else kwargs_source
        if kwargs is not None and not isinstance(kwargs, dict):
            kwargs = await kwargs
        return await psycopg.AsyncConnection.connect(conninfo, **{**(kwargs or {}), "autocommit": True})

    async def _one(self, query: str, params: dict[str, Any] | Sequence[Any]) -> dict[str, Any] | None:
        async with self.pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(query.encode(), params)
            return await cur.fetchone()

    async def _fenced(
        self, run_id: uuid.UUID, query: str, params: dict[str, Any], shared: Shared | None = None, *,
        again: bool = False,
    ) -> dict[str, Any] | None:
        """A write to a held run, sent with the other in-flight runs' writes (group commit); with the
        statement its kind shares with them, when it has one (`params` holds the values it takes).

        `again`: the write is a copy sent after the outcome of the first was lost. The first may still
        be executing on the server, waiting for the run row; the copy locks the row in a statement of
        its own first (groupcommit.py), so the write's statement, whose snapshot is taken after that,
        sees the first copy if it committed and finds it by its write id.
        """
        values = tuple(params[name] for name in shared.columns) if shared is not None else None
        return await self.writes.write(
            run_id, query.encode(), params, (shared, values) if shared is not None and values is not None else None,
            resend=again,
        )

    async def _all(self, query: str, params: dict[str, Any] | Sequence[Any]) -> list[dict[str, Any]]:
        async with self.pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(query.encode(), params)
            return await cur.fetchall()

    # -- runs, as callers see them ----------------------------------------------------------------

    async def create(self, new: NewRun) -> tuple[Run, bool]:
        """Insert a run; returns it and whether it is new.

        A run with the same id (the operator retrying) or the same idempotency key (a client retrying)
        is returned as it is instead of a second one being made. Raises ValueError naming the field
        if a text cannot be stored (a NUL character, a lone surrogate): the caller's input, refused
        whole rather than changed.
        """
        texts = {"input": new.input, "model": new.model, "system": new.system, "idempotency key": new.idempotency_key,
                 **{f"tool name {t!r}": t for t in new.tools or ()}}
        for field, text in texts.items():
            if (why := unstorable(text)) is not None:
                raise ValueError(f"run {field} {why}")
        params = {
            "id": new.id or uuid.uuid4(),
            "input": new.input,
            "model": new.model,
            "system": new.system,
            "tools": list(new.tools) if new.tools is not None else None,
            "token_budget": new.token_budget,
            "cost_budget_usd": new.cost_budget_usd,
            "max_steps": new.max_steps,
            "timeout_seconds": new.timeout_seconds,
            "key": new.idempotency_key,
            "ns": new.k8s_namespace,
            "name": new.k8s_name,
            "by": new.created_by,
            "traceparent": new.traceparent,
            "priority": new.priority,
            "run_at": new.run_at,
            "delay": new.delay_seconds,
        }
        params.update({
            "approval": list(new.require_approval) if new.require_approval is not None else None,
            "schema": Jsonb(new.output_schema) if new.output_schema is not None else None,
            "parent": new.continue_from or (new.fork_from[0] if new.fork_from else None),
            "fork_seq": new.fork_from[1] if new.fork_from else None,
        })
        # The deadline counts from when the run becomes claimable: a run scheduled for tomorrow has its
        # whole timeout from tomorrow. A time already past means at once.
        async with self.pool.connection() as conn, conn.transaction():
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                b"""WITH at AS (
                        SELECT greatest(now(), coalesce(%(run_at)s::timestamptz,
                                                        now() + make_interval(secs => %(delay)s::float8),
                                                        now())) AS run_at),
                    ins AS (
                        INSERT INTO run (id, input, model, system, tools, token_budget, cost_budget_usd,
                                         max_steps, timeout_seconds, deadline_at, idempotency_key,
                                         k8s_namespace, k8s_name, require_approval, output_schema,
                                         parent_run_id, forked_at_seq, created_by, traceparent, priority, run_at)
                        SELECT %(id)s, %(input)s, %(model)s, %(system)s, %(tools)s, %(token_budget)s,
                               %(cost_budget_usd)s, %(max_steps)s, %(timeout_seconds)s,
                               at.run_at + make_interval(secs => %(timeout_seconds)s), %(key)s, %(ns)s, %(name)s,
                               %(approval)s, %(schema)s, %(parent)s, %(fork_seq)s, %(by)s, %(traceparent)s,
                               %(priority)s, at.run_at
                        FROM at
                        ON CONFLICT DO NOTHING
                        RETURNING id)
                    SELECT (SELECT id FROM ins) AS inserted""",
                params,
            )
            row = await cur.fetchone()
            if row is not None and row["inserted"] is not None and params["parent"] is not None:
                # In the same transaction: no worker may claim the run before its inherited steps are there.
                await cur.execute(_INHERIT, params)
        assert row is not None
        if row["inserted"]:
            run = await self.get(row["inserted"])
            assert run is not None
            return run, True
        # The conflicting row may have been committed after this statement's snapshot: look again.
        found = await self._one(
            "SELECT id FROM run WHERE id = %(id)s OR (%(key)s::text IS NOT NULL AND idempotency_key = %(key)s)",
            params,
        )
        run = await self.get(found["id"]) if found else None
        if run is None:
            raise RuntimeError("run insert conflicted on a key that names no run")
        return run, False

    async def get(self, run_id: uuid.UUID) -> Run | None:
        row = await self._one(f"SELECT {RUN_COLUMNS} FROM run r WHERE r.id = %s", (run_id,))
        return _run(row) if row else None

    async def list_runs(
        self, status: RunStatus | None = None, limit: int = 50, after: uuid.UUID | None = None
    ) -> list[Run]:
        """Newest first; `after` is the id of the last run of the previous page (keyset pagination)."""
        rows = await self._all(
            f"""SELECT {RUN_COLUMNS} FROM run r
                WHERE (%(status)s::text IS NULL OR r.status = %(status)s)
                  AND (%(after)s::uuid IS NULL OR (r.created_at, r.id) <
                       (SELECT created_at, id FROM run WHERE id = %(after)s))
                ORDER BY r.created_at DESC, r.id DESC LIMIT %(limit)s""",
            {"status": status.value if status else None, "after": after, "limit": limit},
        )
        return [_run(r) for r in rows]

    async def steps(self, run_id: uuid.UUID, after_seq: int = 0) -> list[Step]:
        rows = await self._all(
            f"SELECT {STEP_COLUMNS} FROM run_step WHERE run_id = %s AND seq > %s ORDER BY seq",
            (run_id, after_seq),
        )
        return [_step(r) for r in rows]

    async def step(self, run_id: uuid.UUID, seq: int) -> Step | None:
        row = await self._one(f"SELECT {STEP_COLUMNS} FROM run_step WHERE run_id = %s AND seq = %s", (run_id, seq))
        return _step(row) if row else None

    async def timeline(self, run_id: uuid.UUID) -> list[Step]:
        """The steps without their request and response bodies."""
        rows = await self._all(
            f"SELECT {TIMELINE_COLUMNS} FROM run_step WHERE run_id = %s ORDER BY seq", (run_id,)
        )
        return [_step(r) for r in rows]

    async def cancel(self, run_id: uuid.UUID, by: str | None = None) -> Run | None:
        """Ask a run to stop: a run no worker drives (queued, scheduled, handed back to wait out a backoff, or
        waiting for a decision) ends CANCELLED at once, a running one within moments
        (the holder hears of it by notification and interrupts the step in flight).

        Returns the run afterwards, or None if there is no such run. A finished run is left as it is.
        `by` is recorded as `cancelled_by` unless someone asked before.
        """
        await self._one(
            """UPDATE run SET cancel_requested = true,
                   cancelled_by = CASE WHEN cancel_requested THEN cancelled_by ELSE %s END,
                   status = CASE WHEN status IN ('QUEUED', 'WAITING') THEN 'CANCELLED' ELSE status END,
                   finished_at = CASE WHEN status IN ('QUEUED', 'WAITING') THEN now() ELSE finished_at END,
                   error = CASE WHEN status = 'QUEUED' AND started_at IS NULL THEN 'cancelled before it started'
                                WHEN status = 'QUEUED' THEN 'cancelled while handed back, before a worker resumed it'
                                WHEN status = 'WAITING' THEN 'cancelled while waiting for a decision'
                                ELSE error END
               WHERE id = %s AND status IN ('QUEUED', 'RUNNING', 'WAITING')
               RETURNING id""",
            (by, run_id),
        )
        return await self.get(run_id)

    async def count_by_status(self) -> dict[str, int]:
        """How many runs there are in each status (for the metrics gauge)."""
        rows = await self._all("SELECT status, count(*) AS n FROM run GROUP BY status", ())
        return {r["status"]: int(r["n"]) for r in rows}

    # -- the lease -------------------------------------------------------------------------------

    async def claim(
        self, worker: str, lease_seconds: float, liveness: bool = False, liveness_grace: float = 1.0
    ) -> Claim | None:
        """Take the claimable run of highest priority, oldest first (`claim_many` for one)."""
        claims = await self.claim_many(worker, lease_seconds, liveness, liveness_grace, limit=1)
        return claims[0] if claims else None

    async def claim_many(
        self, worker: str, lease_seconds: float, liveness: bool = False, liveness_grace: float = 1.0, *,
        limit: int = 1,
    ) -> list[Claim]:
        """Take up to `limit` claimable runs of highest priority, oldest first, in one statement: queued,
        or running under a lease that has lapsed, and whose `run_at` has come.

        With `liveness`, also a running run whose worker is dead: its liveness lock (presence.py) is free,
        and has stayed free for `liveness_grace` seconds since a claim first found it so (`suspect`). A
        live worker whose connection dropped takes its lock back within that grace, so only a worker that
        is gone loses its runs early. The CASE keeps the lock attempt to RUNNING candidates with a live
        lease whose holder is suspected, and runs it last.
        """
        rows = await self._all(
            f"""WITH next AS (
                    SELECT id, CASE WHEN status = 'RUNNING' THEN locked_by END AS taken_from FROM run
                    WHERE run_at <= now() AND status IN ('QUEUED', 'RUNNING') AND CASE
                          WHEN status = 'QUEUED' OR locked_until < now() THEN true
                          WHEN NOT %(liveness)s THEN false
                          WHEN NOT EXISTS (SELECT 1 FROM worker_suspect ws WHERE ws.worker = run.locked_by
                                           AND ws.since <= now() - make_interval(secs => %(grace)s)) THEN false
                          ELSE pg_try_advisory_xact_lock(%(lock_class)s, hashtext(locked_by)) END
                    ORDER BY priority DESC, run_at FOR UPDATE SKIP LOCKED LIMIT %(limit)s)
                UPDATE run r SET status = 'RUNNING', locked_by = %(worker)s, lease_epoch = r.lease_epoch + 1,
                       locked_until = now() + make_interval(secs => %(lease)s),
                       started_at = coalesce(r.started_at, now()), claims = r.claims + 1,
                       crashes = r.crashes + CASE WHEN r.status = 'RUNNING' AND NOT r.handed_back THEN 1 ELSE 0 END,
                       handed_back = false
                FROM next WHERE r.id = next.id
                RETURNING {RUN_COLUMNS}, now() AS db_now, next.taken_from""",
            {"worker": worker, "lease": lease_seconds, "liveness": liveness, "lock_class": LIVENESS_LOCK_CLASS,
             "grace": liveness_grace, "limit": limit},
        )
        claims = []
        for row in rows:
            db_now = row.pop("db_now")
            taken_from = row.pop("taken_from")
            run = _run(row)
            claims.append(Claim(run, Progress(run.tokens_used, run.cost_usd, run.cancel_requested, db_now), taken_from))
        # Highest priority first, as they were chosen (UPDATE … RETURNING keeps no order of its own).
        claims.sort(key=lambda c: (-c.run.priority, c.run.run_at or c.progress.db_now))
        return claims

    async def suspect(self, worker: str, liveness_grace: float) -> float | None:
        """Look for workers holding live leases whose liveness lock is free, and note since when.

        Forgets the suspicions of workers that hold nothing any more. Returns the seconds until the
        earliest suspicion is old enough for a claim to take that worker's runs, or None if there is none.
        """
        row = await self._one(
            """WITH holders AS (
                    SELECT DISTINCT locked_by AS worker FROM run
                    WHERE status = 'RUNNING' AND locked_until >= now() AND locked_by <> %(worker)s),
                free AS (
                    SELECT worker FROM holders WHERE pg_try_advisory_xact_lock(%(lock_class)s, hashtext(worker))),
                noted AS (
                    INSERT INTO worker_suspect (worker) SELECT worker FROM free
                    ON CONFLICT (worker) DO NOTHING RETURNING since),
                forgotten AS (
                    DELETE FROM worker_suspect ws
                    WHERE NOT EXISTS (SELECT 1 FROM holders h WHERE h.worker = ws.worker))
                SELECT extract(epoch FROM least(
                    (SELECT min(ws.since) FROM worker_suspect ws JOIN free USING (worker)),
                    (SELECT min(since) FROM noted))
                    + make_interval(secs => %(grace)s) - now())::float8 AS wait""",
            {"worker": worker, "lock_class": LIVENESS_LOCK_CLASS, "grace": liveness_grace},
        )
        wait = row["wait"] if row else None
        return None if wait is None else max(float(wait), 0.0)

    async def next_run_in(self) -> float | None:
        """Seconds until the earliest scheduled run (or one handed back with a delay) becomes claimable;
        None if there is none. An idle worker sleeps no longer than this, so a scheduled run starts on time."""
        row = await self._one(
            """SELECT extract(epoch FROM min(run_at) - now())::float8 AS wait FROM run
               WHERE status IN ('QUEUED', 'RUNNING') AND run_at > now()""",
            (),
        )
        wait = row["wait"] if row else None
        return None if wait is None else max(float(wait), 0.0)

    async def vouch(self, worker: str) -> None:
        """Withdraw any suspicion of `worker`: called by its presence connection once it holds its lock."""
        await self._one("DELETE FROM worker_suspect WHERE worker = %s RETURNING worker", (worker,))

    async def renew(
        self, run_ids: Sequence[uuid.UUID], worker: str, lease_seconds: float,
        epochs: Mapping[uuid.UUID, int] | None = None,
    ) -> dict[uuid.UUID, bool]:
        """Extend the leases of runs this worker holds; returns each still-held run's cancel flag.

        `epochs` names the claim each run is held under (a run claimed again since is not renewed for
        the earlier claim). A run missing from the answer is lost. A held run whose row is locked at this moment (by a
        batch of this worker's writes, which renews its lease itself, or by a cancel) is skipped, not
        waited for, and counted held with no cancel seen: a renewal waiting on a batch while that batch
        waits on a run the renewal locked would be a deadlock.
        """
        rows = await self._all(
            """WITH held AS (SELECT * FROM unnest(%(ids)s::uuid[], %(epochs)s::bigint[]) AS h (id, epoch)),
                mine AS (
                    SELECT run.id, run.cancel_requested FROM run JOIN held ON run.id = held.id
                    WHERE run.locked_by = %(worker)s AND run.status = 'RUNNING'
                      AND (held.epoch IS NULL OR run.lease_epoch = held.epoch)),
                free AS (
                    SELECT id FROM run WHERE id IN (SELECT id FROM mine) AND locked_by = %(worker)s
                      AND status = 'RUNNING' FOR UPDATE SKIP LOCKED),
                renewed AS (
                    UPDATE run SET locked_until = now() + make_interval(secs => %(lease)s)
                    FROM free WHERE run.id = free.id RETURNING run.id, run.cancel_requested)
                SELECT mine.id, coalesce(renewed.cancel_requested, false) AS cancel_requested
                FROM mine LEFT JOIN renewed USING (id)""",
            {"ids": list(run_ids), "epochs": [(epochs or {}).get(i) for i in run_ids], "worker": worker,
             "lease": lease_seconds},
        )
        return {r["id"]: r["cancel_requested"] for r in rows}

    async def release(
        self, run_id: uuid.UUID, worker: str, *, delay: float | None = None, epoch: int | None = None,
        again: bool = False,
    ) -> bool:
        """Give a held run back at once, so another worker resumes it without waiting for the lease; False
        if this worker did not hold it (under `epoch`, the claim it was held under).

        The run is QUEUED again with no holder: nobody drives it, so a cancel ends it at once. With
        `delay` (seconds), it is claimable again only after it (a model API outage: a later claim
        retries the model step; `run_at` says when) and counts as one more consecutive model failure.
        A copy sent again finds the run handed back under the same epoch and counts nothing twice.
        """
        row = await self._fenced(
            run_id,
            f"""WITH released AS (
                    UPDATE run SET status = 'QUEUED', locked_by = NULL, locked_until = NULL, handed_back = true,
                        run_at = CASE WHEN %(delay)s::float8 IS NULL THEN run_at
                                      ELSE least(now() + make_interval(secs => %(delay)s), deadline_at) END,
                        model_retries = model_retries + CASE WHEN %(delay)s::float8 IS NULL THEN 0 ELSE 1 END
                    WHERE id = %(id)s AND locked_by = %(worker)s AND status = 'RUNNING' AND {EPOCH}
                    RETURNING id)
                SELECT coalesce(
                    (SELECT id FROM released),
                    (SELECT id FROM run WHERE id = %(id)s AND %(epoch)s::bigint IS NOT NULL
                        AND lease_epoch = %(epoch)s::bigint AND handed_back AND locked_by IS NULL)) AS id""",
            {"id": run_id, "worker": worker, "delay": delay, "epoch": epoch},
            again=again,
        )
        return row is not None and row["id"] is not None

    # -- fenced writes of a held run -----------------------------------------------------------

    async def checkpoint_model(
        self,
        run_id: uuid.UUID,
        worker: str,
        lease_seconds: float,
        *,
        write_id: uuid.UUID | None = None,
        epoch: int | None = None,
        again: bool = False,
        request: str,
        response: str,
        stop_reason: str | None,
        input_tokens: int,
        output_tokens: int,
        cache_creation_input_tokens: int,
        cache_read_input_tokens: int,
        cost_usd: Decimal | None,
        latency_ms: int,
    ) -> tuple[int, Progress]:
        """The model step row, the token and cost counters and the lease renewal, all or nothing.

        `write_id` names this write: sent again after its outcome was lost with a connection (`again`),
        it finds the step it already wrote instead of appending a second one, and adds no tokens twice.
        Every fenced write takes `epoch`, the lease epoch of the claim it is made under (Run.lease_epoch).
        """
        tokens = input_tokens + output_tokens + cache_creation_input_tokens + cache_read_input_tokens
        # Counted only by the write that made the step, not by a copy of it sent again.
        extra = """, tokens_used = run.tokens_used + CASE WHEN EXISTS (SELECT FROM step) THEN %(tokens)s ELSE 0 END,
                   cost_usd = run.cost_usd + CASE WHEN EXISTS (SELECT FROM step) THEN coalesce(%(cost)s, 0) ELSE 0 END,
                   model_retries = 0"""
        row = await self._fenced(
            run_id,
            f"""WITH {FENCE},
                done AS (SELECT seq FROM run_step WHERE run_id = %(id)s AND write_id = %(wid)s),
                step AS (
                    INSERT INTO run_step (run_id, seq, kind, status, request, response, stop_reason,
                        input_tokens, output_tokens, cache_creation_input_tokens, cache_read_input_tokens,
                        cost_usd, latency_ms, worker, started_at, finished_at, write_id)
                    SELECT id, (SELECT coalesce(max(seq), 0) + 1 FROM run_step WHERE run_id = %(id)s),
                        'MODEL', 'DONE', %(request)s, %(response)s, %(stop)s, %(in)s, %(out)s,
                        %(cw)s, %(cr)s, %(cost)s, %(ms)s, %(worker)s,
                        now() - make_interval(secs => %(ms)s / 1000.0), now(), %(wid)s
                    FROM fence WHERE NOT EXISTS (SELECT 1 FROM done)
                    RETURNING seq),
                {OWNED.format(extra=extra)}
                SELECT coalesce((SELECT seq FROM step), (SELECT seq FROM done)) AS seq, {PROGRESS} FROM owned""",
            {
                "id": run_id, "worker": worker, "lease": lease_seconds, "tokens": tokens, "cost": cost_usd,
                "request": request, "response": response, "stop": stop_reason, "in": input_tokens,
                "out": output_tokens, "cw": cache_creation_input_tokens, "cr": cache_read_input_tokens,
                "ms": latency_ms, "wid": write_id or uuid.uuid4(), "epoch": epoch,
            },
            shared=CHECKPOINTS, again=again,
        )
        if row is None:
            raise LeaseLost(run_id, worker)
        return row["seq"], _progress(row)

    async def start_tool(
        self, run_id: uuid.UUID, worker: str, lease_seconds: float, *, write_id: uuid.UUID | None = None,
        epoch: int | None = None, again: bool = False, tool_use_id: str, tool_name: str, request: str,
    ) -> tuple[int, int, Progress]:
        """Write the STARTED row before the tool runs; returns (seq, attempts, progress).

        The tool_use id is the key: after a crash the same row is found again (`attempts` counts the
        executions) instead of a second step being appended. The same `write_id` sent again (its first
        outcome was lost) counts no second execution.
        """
        row = await self._fenced(
            run_id,
            f"""WITH {FENCE},
                done AS (SELECT seq, attempts FROM run_step
                         WHERE run_id = %(id)s AND kind = 'TOOL' AND tool_use_id = %(tuid)s
                           AND write_id = %(wid)s AND status = 'STARTED'),
                step AS (
                    INSERT INTO run_step (run_id, seq, kind, tool_name, tool_use_id, status, request, worker,
                                          write_id)
                    SELECT id, (SELECT coalesce(max(seq), 0) + 1 FROM run_step WHERE run_id = %(id)s),
                        'TOOL', %(name)s, %(tuid)s, 'STARTED', %(request)s, %(worker)s, %(wid)s
                    FROM fence WHERE NOT EXISTS (SELECT 1 FROM done)
                    ON CONFLICT (run_id, tool_use_id) WHERE kind = 'TOOL'
                    DO UPDATE SET attempts = run_step.attempts + 1, worker = EXCLUDED.worker,
                                  started_at = now(), write_id = EXCLUDED.write_id
                    WHERE run_step.status = 'STARTED' AND run_step.write_id IS DISTINCT FROM EXCLUDED.write_id
                    RETURNING seq, attempts),
                {OWNED.format(extra="")}
                SELECT coalesce(step.seq, done.seq) AS seq, coalesce(step.attempts, done.attempts) AS attempts,
                       {PROGRESS}
                FROM owned LEFT JOIN step ON true LEFT JOIN done ON true""",
            {"id": run_id, "worker": worker, "lease": lease_seconds, "tuid": tool_use_id, "name": tool_name,
             "request": request, "wid": write_id or uuid.uuid4(), "epoch": epoch},
            shared=TOOL_STARTS, again=again,
        )
        if row is None:
            raise LeaseLost(run_id, worker)
        if row["seq"] is None:
            raise RuntimeError(f"run {run_id}: tool step {tool_use_id} is already finished")
        return row["seq"], row["attempts"], _progress(row)

    async def finish_tool(
        self, run_id: uuid.UUID, worker: str, lease_seconds: float, *, write_id: uuid.UUID | None = None,
        epoch: int | None = None, again: bool = False, tool_use_id: str, ok: bool, output: str, latency_ms: int,
    ) -> Progress:
        """Record a tool's outcome. Only a STARTED step changes; the same `write_id` sent again (its first
        outcome was lost) finds its own write and changes nothing."""
        row = await self._fenced(
            run_id,
            f"""WITH {FENCE},
                step AS (
                    UPDATE run_step SET status = %(status)s, response = %(output)s, latency_ms = %(ms)s,
                                        worker = %(worker)s, finished_at = now(), write_id = %(wid)s
                    FROM fence
                    WHERE run_step.run_id = fence.id AND run_step.kind = 'TOOL'
                      AND run_step.tool_use_id = %(tuid)s
                      AND (run_step.status = 'STARTED' OR run_step.write_id = %(wid)s)
                    RETURNING seq),
                {OWNED.format(extra="")}
                SELECT step.seq, {PROGRESS} FROM owned LEFT JOIN step ON true""",
            {"id": run_id, "worker": worker, "lease": lease_seconds, "tuid": tool_use_id,
             "status": "DONE" if ok else "ERROR", "output": output, "ms": latency_ms, "wid": write_id or uuid.uuid4(),
             "epoch": epoch},
            shared=TOOL_FINISHES, again=again,
        )
        if row is None:
            raise LeaseLost(run_id, worker)
        if row["seq"] is None:
            raise RuntimeError(f"run {run_id}: tool step {tool_use_id} was not STARTED")
        return _progress(row)

    async def finish(
        self, run_id: uuid.UUID, worker: str, status: RunStatus, error: str | None, *, again: bool = False,
        output: Any = None, epoch: int | None = None,
    ) -> int:
        """End a held run; returns its tokens used. locked_by keeps the worker that finished it.

        `again` is for sending the same finish after its outcome was lost: a run this worker already
        ended with that status counts as done rather than as a lost lease.
        """
        assert status.terminal
        params = {"status": status.value, "error": clean(error) if error is not None else None, "id": run_id,
                  "worker": worker, "again": again, "output": Jsonb(output) if output is not None else None,
                  "epoch": epoch}
        row = await self._fenced(
            run_id,
            f"""WITH done AS (
                    UPDATE run SET status = %(status)s, error = %(error)s, finished_at = now(), locked_until = NULL,
                                   output = %(output)s
                    WHERE id = %(id)s AND locked_by = %(worker)s AND status = 'RUNNING' AND {EPOCH}
                    RETURNING tokens_used)
                SELECT coalesce(
                    (SELECT tokens_used FROM done),
                    (SELECT tokens_used FROM run WHERE %(again)s AND id = %(id)s AND locked_by = %(worker)s
                        AND status = %(status)s AND {EPOCH})) AS tokens_used""",
            params, again=again,
        )
        if row is None or row["tokens_used"] is None:
            raise LeaseLost(run_id, worker)
        return int(row["tokens_used"])

    async def settle_tool(
        self, run_id: uuid.UUID, worker: str, lease_seconds: float, *, write_id: uuid.UUID | None = None,
        epoch: int | None = None, again: bool = False, tool_use_id: str, tool_name: str, request: str, ok: bool,
        output: str,
    ) -> Progress:
        """Record a tool call's outcome without executing it (a person denied it, or recorded what a call in
        doubt did): a finished step, made at once, or the call's STARTED row finished. Never executed
        here, so a new row counts 0 attempts."""
        row = await self._fenced(
            run_id,
            f"""WITH {FENCE},
                step AS (
                    INSERT INTO run_step (run_id, seq, kind, tool_name, tool_use_id, status, request, response,
                                          attempts, worker, finished_at, write_id)
                    SELECT id, (SELECT coalesce(max(seq), 0) + 1 FROM run_step WHERE run_id = %(id)s),
                        'TOOL', %(name)s, %(tuid)s, %(status)s, %(request)s, %(output)s, 0, %(worker)s, now(), %(wid)s
                    FROM fence
                    ON CONFLICT (run_id, tool_use_id) WHERE kind = 'TOOL'
                    DO UPDATE SET status = EXCLUDED.status, response = EXCLUDED.response, worker = EXCLUDED.worker,
                                  finished_at = now(), write_id = EXCLUDED.write_id
                    WHERE run_step.status = 'STARTED' OR run_step.write_id = EXCLUDED.write_id
                    RETURNING seq),
                {OWNED.format(extra="")}
                SELECT step.seq, {PROGRESS} FROM owned LEFT JOIN step ON true""",
            {"id": run_id, "worker": worker, "lease": lease_seconds, "tuid": tool_use_id, "name": tool_name,
             "request": request, "status": "DONE" if ok else "ERROR", "output": output,
             "wid": write_id or uuid.uuid4(), "epoch": epoch},
            again=again,
        )
        if row is None:
            raise LeaseLost(run_id, worker)
        if row["seq"] is None:
            raise RuntimeError(f"run {run_id}: tool step {tool_use_id} is already finished")
        return _progress(row)

    async def add_user_step(
        self, run_id: uuid.UUID, worker: str, lease_seconds: float, *, write_id: uuid.UUID | None = None,
        epoch: int | None = None, again: bool = False, text: str, request: str | None = None,
    ) -> Progress:
        """Append a user message to a held run's conversation (a correction the engine makes)."""
        row = await self._fenced(
            run_id,
            f"""WITH {FENCE},
                done AS (SELECT seq FROM run_step WHERE run_id = %(id)s AND write_id = %(wid)s),
                step AS (
                    INSERT INTO run_step (run_id, seq, kind, status, request, response, worker, finished_at, write_id)
                    SELECT id, (SELECT coalesce(max(seq), 0) + 1 FROM run_step WHERE run_id = %(id)s),
                        'USER', 'DONE', %(request)s, %(text)s, %(worker)s, now(), %(wid)s
                    FROM fence WHERE NOT EXISTS (SELECT 1 FROM done)
                    RETURNING seq),
                {OWNED.format(extra="")}
                SELECT {PROGRESS} FROM owned""",
            {"id": run_id, "worker": worker, "lease": lease_seconds, "text": text, "request": request,
             "wid": write_id or uuid.uuid4(), "epoch": epoch},
            again=again,
        )
        if row is None:
            raise LeaseLost(run_id, worker)
        return _progress(row)

    # -- people in the loop ------------------------------------------------------------------------

    async def park(
        self, run_id: uuid.UUID, worker: str, calls: Sequence[tuple[str, DecisionKind, str, str | None, int]], *,
        epoch: int | None = None, again: bool = False,
    ) -> None:
        """Hand a held run over to people: one pending decision per (tool_use id, kind, tool, input, attempt),
        and the run WAITING with no lease, so no worker holds it and nothing is spent while it waits.

        A copy sent again (`again`) finds the run parked under the same epoch (waiting, or past it:
        decided, cancelled, timed out) and counts as done."""
        row = await self._fenced(
            run_id,
            f"""WITH {FENCE},
                asked AS (
                    INSERT INTO run_decision (run_id, tool_use_id, kind, tool_name, input, attempt, position)
                    SELECT fence.id, c.tuid, c.kind, c.name, c.input, c.attempt, c.position
                    FROM fence, unnest(%(tuids)s::text[], %(kinds)s::text[], %(names)s::text[], %(inputs)s::text[],
                                       %(attempts)s::int[])
                         WITH ORDINALITY AS c (tuid, kind, name, input, attempt, position)
                    ON CONFLICT (run_id, tool_use_id, kind, attempt) DO NOTHING),
                parked AS (
                    UPDATE run SET status = 'WAITING', locked_by = NULL, locked_until = NULL
                    FROM fence WHERE run.id = fence.id RETURNING run.id)
                SELECT coalesce(
                    (SELECT id FROM parked),
                    (SELECT id FROM run WHERE id = %(id)s AND %(epoch)s::bigint IS NOT NULL
                        AND lease_epoch = %(epoch)s::bigint AND status <> 'RUNNING' AND locked_by IS NULL
                        AND NOT handed_back)) AS id""",
            {"id": run_id, "worker": worker, "tuids": [c[0] for c in calls], "kinds": [c[1].value for c in calls],
             "names": [c[2] for c in calls], "inputs": [c[3] for c in calls], "attempts": [c[4] for c in calls],
             "epoch": epoch},
            again=again,
        )
        if row is None or row["id"] is None:
            raise LeaseLost(run_id, worker)

    async def reconcile(
        self, run_id: uuid.UUID, worker: str, lease_seconds: float, *, epoch: int | None = None,
        again: bool = False, tool_use_id: str, tool_name: str, input: str | None, attempt: int, decision: Decision,
        output: str | None, reason: str,
    ) -> PendingCall:
        """Store what a tool's reconcile probe found about a call in doubt at `attempt` as the decision on it
        (`decided_by` "reconcile"), before the engine acts on it; returns the decision stored. A copy sent
        again (its outcome was lost) or a probe run again after a crash finds the one stored first and
        returns that: one decision per attempt, whoever took it."""
        row = await self._fenced(
            run_id,
            f"""WITH {FENCE},
                decided AS (
                    INSERT INTO run_decision (run_id, tool_use_id, kind, tool_name, input, attempt, decision,
                                              output, reason, decided_at, decided_by)
                    SELECT fence.id, %(tuid)s, 'in_doubt', %(name)s, %(input)s, %(attempt)s, %(decision)s,
                           %(output)s, %(reason)s, now(), 'reconcile'
                    FROM fence
                    ON CONFLICT (run_id, tool_use_id, kind, attempt) DO UPDATE SET tool_name = run_decision.tool_name
                    RETURNING {DECISION_COLUMNS}),
                {OWNED.format(extra="")}
                SELECT decided.* FROM owned, decided""",
            {"id": run_id, "worker": worker, "lease": lease_seconds, "tuid": tool_use_id, "name": tool_name,
             "input": input, "attempt": attempt, "decision": decision.value, "output": output,
             "reason": clean(reason), "epoch": epoch},
            again=again,
        )
        if row is None:
            raise LeaseLost(run_id, worker)
        return _pending(row)

    async def decisions(self, run_id: uuid.UUID) -> list[PendingCall]:
        """Every call of the run that needed a person, decided or not, oldest first."""
        rows = await self._all(
            f"SELECT {DECISION_COLUMNS} FROM run_decision WHERE run_id = %s ORDER BY since, position, attempt",
            (run_id,),
        )
        return [_pending(r) for r in rows]

    async def decide(
        self, run_id: uuid.UUID, tool_use_id: str, decision: Decision, *, output: str | None = None,
        is_error: bool = False, reason: str | None = None, by: str | None = None,
    ) -> tuple[DecideOutcome, Run | None]:
        """Store a decision on a pending call, exactly once; the last open one queues the run again.

        The run row is locked first, so two decisions on one run are taken one after the other: of two
        on the same call the second finds it decided; of the last two open ones, the second sees the
        first and queues the run.
        """
        async with self.pool.connection() as conn, conn.transaction():
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(b"SELECT status FROM run WHERE id = %s FOR UPDATE", (run_id,))
            found = await cur.fetchone()
            if found is None:
                return DecideOutcome.NO_RUN, None
            await cur.execute(  # the open one first: an approved call may be in doubt now, or in doubt again
                b"""SELECT kind, attempt, decision FROM run_decision WHERE run_id = %s AND tool_use_id = %s
                    ORDER BY decision IS NULL DESC, since DESC, attempt DESC LIMIT 1""",
                (run_id, tool_use_id),
            )
            call = await cur.fetchone()
            if call is None:
                return DecideOutcome.NO_CALL, None
            if call["kind"] != decision.kind.value:
                return DecideOutcome.WRONG_KIND, None
            if call["decision"] is not None or found["status"] != RunStatus.WAITING.value:
                return DecideOutcome.ALREADY, None
            await cur.execute(
                b"""UPDATE run_decision SET decision = %(decision)s, output = %(output)s, is_error = %(is_error)s,
                           reason = %(reason)s, decided_at = now(), decided_by = %(by)s
                    WHERE run_id = %(id)s AND tool_use_id = %(tuid)s AND kind = %(kind)s AND attempt = %(attempt)s""",
                {"decision": decision.value, "kind": call["kind"], "attempt": call["attempt"], "output": output,
                 "is_error": is_error,
                 "reason": clean(reason) if reason is not None else None, "by": by, "id": run_id,
                 "tuid": tool_use_id},
            )
            await cur.execute(
                b"""UPDATE run SET status = 'QUEUED', run_at = now()
                    WHERE id = %s AND status = 'WAITING'
                      AND NOT EXISTS (SELECT 1 FROM run_decision WHERE run_id = %s AND decision IS NULL)""",
                (run_id, run_id),
            )
        return DecideOutcome.DECIDED, await self.get(run_id)

    async def expire_waiting(self) -> list[uuid.UUID]:
        """End the waiting runs whose deadline has passed (no worker holds them to notice)."""
        rows = await self._all(
            """UPDATE run SET status = 'TIMED_OUT', finished_at = now(),
                   error = 'deadline passed while waiting for a decision: the run may take '
                           || timeout_seconds || 's'
               WHERE status = 'WAITING' AND deadline_at <= now() RETURNING id""",
            (),
        )
        return [r["id"] for r in rows]

    # -- for the Kubernetes operator -------------------------------------------------------------

    async def get_many(self, run_ids: Sequence[uuid.UUID]) -> list[Run]:
        """The runs among `run_ids` that exist, in no particular order (one query for a batch)."""
        if not run_ids:
            return []
        rows = await self._all(f"SELECT {RUN_COLUMNS} FROM run r WHERE r.id = ANY(%s)", (list(run_ids),))
        return [_run(r) for r in rows]

    async def find_linked(self, namespace: str, name: str) -> Run | None:
        """The run mirrored from the AgentRun `namespace/name`, if any (the newest, should names repeat)."""
        row = await self._one(
            f"""SELECT {RUN_COLUMNS} FROM run r WHERE r.k8s_namespace = %s AND r.k8s_name = %s
                ORDER BY r.created_at DESC LIMIT 1""",
            (namespace, name),
        )
        return _run(row) if row else None

    async def unfinished_linked(self) -> list[Run]:
        """Every queued or running run mirrored from an AgentRun: the operator's periodic resync."""
        rows = await self._all(
            f"""SELECT {RUN_COLUMNS} FROM run r
                WHERE r.k8s_name IS NOT NULL AND r.status IN ('QUEUED', 'RUNNING', 'WAITING')""",
            (),
        )
        return [_run(r) for r in rows]
