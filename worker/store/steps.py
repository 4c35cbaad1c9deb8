"""The fenced writes of a held run: a model step, a tool call started and finished, the run's end.

Each write is ONE statement (data-modifying CTEs), atomic by itself; it renews the lease and returns
the run's counters for the guard. The writes of held runs go through group commit (groupcommit.py):
alone when nothing else is queued, else with the other runs' writes in one transaction and one round
trip, where the three writes every step makes share one statement per kind (CHECKPOINTS, TOOL_STARTS,
TOOL_FINISHES), each run in it fenced on its own."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import orjson
from psycopg.types.json import Jsonb

from agentrun.worker.core.records import (
    ModelTurn,
    Progress,
    RunStatus,
    StepKind,
)
from agentrun.worker.core.text import clean
from agentrun.worker.store.gateway import Gateway
from agentrun.worker.store.groupcommit import Shared
from agentrun.worker.store.rows import (
    EPOCH,
    FENCE,
    OWNED,
    PROGRESS,
    LeaseLost,
    as_progress,
)

# The shared forms of the three writes every step makes (groupcommit.py): one statement for the copies
# of many runs. `w` has a row per run; `fence` locks, in id order, those still held by the worker that
# sent its row; every other part joins it, so a run whose lease is gone gets no row back and nothing
# written, whatever happens to the others. Each reads and writes as its one-run form above does.
SHARED_FENCE = """fence AS (
    SELECT run.id, run.cancel_requested, run.deadline_at FROM run JOIN w ON run.id = w.id AND run.locked_by = w.worker
    WHERE run.id = ANY(%(id)s::uuid[]) AND run.status = 'RUNNING' AND (w.epoch IS NULL OR run.lease_epoch = w.epoch)
    ORDER BY run.id FOR UPDATE OF run)"""
# `run.id = ANY(...)` is what keeps the lock on the primary key: joined to `w` alone, the planner read every
# RUNNING run (run_tenant_running_idx) and sorted them for a merge join, in every batch: a batch of a worker
# with 10,000 runs in flight read 10,000 rows to lock a handful (issue 48 §1).

# The tool calls of a model turn that will run at once, STARTED by the statement that checkpoints the turn
# (runtime/people.py `unasked`): for each run a JSON array of [tool_use_id, name, request], or '[]'. Their rows take
# the seqs right after the model step's, carry its write id (a copy of the checkpoint sent again finds them), and
# are not written at all if the run was asked to stop or its deadline has passed: read under the run's lock,
# so a cancel committed meanwhile is seen and no call is STARTED that will not run.
SHARED_CALLS = "jsonb_array_elements(w.starts::jsonb) WITH ORDINALITY AS c (call, n)"
ONE_RUN_CALLS = "jsonb_array_elements(%(starts)s::jsonb) WITH ORDINALITY AS c (call, n)"
STARTED_ROW = """'TOOL', c.call->>1, c.call->>0, 'STARTED', c.call->>2"""
FENCE_STARTS = FENCE.replace("SELECT id FROM run", "SELECT id, cancel_requested, deadline_at FROM run")
STARTABLE = "NOT fence.cancel_requested AND (fence.deadline_at IS NULL OR now() < fence.deadline_at)"

# Each statement is prepared once per connection and runs on PostgreSQL's generic plan, made when it was
# prepared: on a new database, while the tables were small and a sequential scan looked cheapest. So no part of
# a shared form may leave the planner free to read a whole table for each batch: `done` joined run_step to the
# batch and got a hash join over all of run_step, cached for the connection's life, so that B1's database time
# per step grew with the table (0.48 ms at 800 runs, 0.82 ms at 2,000: issue 48 §2). A copy of a write that was
# sent again now looks for its first copy by its run's key, in a lateral subquery with a LIMIT (which the planner
# cannot turn into a join), and only a copy looks (`w.again`); a step is found by its key (step_tool_uk). A run
# is joined on `run.id = w.id` alone: with `= ANY(...)` beside it the planner scanned run_created_idx or the
# table instead of run_pkey.

# The shared forms take every value as an array parameter in binary (`%(x)b`): psycopg writes a text array
# in Python, quoting and escaping each element with a regular expression, about 50 µs a run for a checkpoint's
# 16 arrays against 8 µs in binary (the JSON of requests and responses is full of quotes to escape).
BY_TEXT, IN_BINARY = b")s::", b")b::"

SHARED_PROGRESS = (
    "owned.id, owned.tokens_used, owned.cost_usd, owned.cancel_requested, owned.db_now, owned.messages_waiting")

# What a model step spent, added to its tenant's usage of this minute (the daily budgets sum the last 1,440:
# store/tenants.py) by the statement that writes the step, so a step is counted once or not at all, whatever
# crashes: a copy sent again writes no step and adds nothing. Each database session adds to a row of its own
# (the worker's id and the session's pid), so two transactions never wait on one row, nor lock two in
# opposite orders. The shared form adds a batch's steps per tenant, one row each.
USAGE_ROW = "date_trunc('minute', now()), %(worker)s || '/' || pg_backend_pid()"
ADD_USAGE = """ON CONFLICT (tenant, minute, worker)
    DO UPDATE SET tokens = u.tokens + EXCLUDED.tokens, cost_usd = u.cost_usd + EXCLUDED.cost_usd"""
USED = f"""used AS (
    INSERT INTO tenant_usage AS u (tenant, minute, worker, tokens, cost_usd)
    SELECT run.tenant, {USAGE_ROW}, %(tokens)s, coalesce(%(cost)s, 0)
    FROM run WHERE run.id = %(id)s AND EXISTS (SELECT FROM step)
    {ADD_USAGE})"""
SHARED_USED = f"""used AS (
    INSERT INTO tenant_usage AS u (tenant, minute, worker, tokens, cost_usd)
    SELECT owned.tenant, date_trunc('minute', now()), min(w.worker) || '/' || pg_backend_pid(), sum(step.tokens),
        sum(coalesce(step.cost_usd, 0))
    FROM step JOIN owned USING (id) JOIN w USING (id)
    GROUP BY owned.tenant ORDER BY owned.tenant
    {ADD_USAGE})"""

CHECKPOINTS = Shared("checkpoint_model", f"""
WITH w AS (
    SELECT * FROM unnest(%(id)s::uuid[], %(worker)s::text[], %(epoch)s::bigint[], %(lease)s::float8[],
        %(wid)s::uuid[], %(request)s::text[], %(response)s::text[], %(stop)s::text[], %(in)s::int[], %(out)s::int[],
        %(cw)s::int[], %(cr)s::int[], %(cost)s::numeric[], %(ms)s::int[], %(kind)s::text[], %(starts)s::text[],
        %(again)s::boolean[])
    AS w (id, worker, epoch, lease, wid, request, response, stop, i, o, cw, cr, cost, ms, kind, starts, again)),
{SHARED_FENCE},
done AS (SELECT w.id, d.seq FROM w CROSS JOIN LATERAL (
    SELECT s.seq FROM run_step s WHERE w.again AND s.run_id = w.id AND s.write_id = w.wid AND s.kind = w.kind
    LIMIT 1) d),
step AS (
    INSERT INTO run_step (run_id, seq, kind, status, request, response, stop_reason,
        input_tokens, output_tokens, cache_creation_input_tokens, cache_read_input_tokens,
        cost_usd, latency_ms, worker, started_at, finished_at, write_id)
    SELECT w.id, (SELECT coalesce(max(s.seq), 0) + 1 FROM run_step s WHERE s.run_id = w.id),
        w.kind, 'DONE', w.request, w.response, w.stop, w.i, w.o, w.cw, w.cr, w.cost, w.ms, w.worker,
        now() - make_interval(secs => w.ms / 1000.0), now(), w.wid
    FROM w JOIN fence USING (id) WHERE NOT EXISTS (SELECT 1 FROM done WHERE done.id = w.id)
    RETURNING run_id AS id, seq,
        input_tokens + output_tokens + cache_creation_input_tokens + cache_read_input_tokens AS tokens, cost_usd),
started AS (
    INSERT INTO run_step (run_id, seq, kind, tool_name, tool_use_id, status, request, worker, write_id)
    SELECT step.id, step.seq + c.n, {STARTED_ROW}, w.worker, w.wid
    FROM step JOIN w USING (id) JOIN fence USING (id) CROSS JOIN LATERAL {SHARED_CALLS}
    WHERE {STARTABLE}
    ON CONFLICT (run_id, tool_use_id) WHERE kind = 'TOOL' DO NOTHING
    RETURNING run_id AS id),
owned AS (
    UPDATE run SET locked_until = now() + make_interval(secs => w.lease),
        tokens_used = run.tokens_used + coalesce(step.tokens, 0),
        cost_usd = run.cost_usd + coalesce(step.cost_usd, 0), model_retries = 0
    FROM w JOIN fence USING (id) LEFT JOIN step USING (id) WHERE run.id = w.id
    RETURNING run.id, run.tokens_used, run.cost_usd, run.cancel_requested, now() AS db_now,
        run.messages_sent - run.messages_delivered AS messages_waiting, run.tenant),
{SHARED_USED}
SELECT coalesce(step.seq, done.seq) AS seq, {SHARED_PROGRESS},
    CASE WHEN done.id IS NULL THEN (SELECT count(*) FROM started WHERE started.id = owned.id)
         ELSE (SELECT count(*) FROM run_step s JOIN w ON s.run_id = w.id AND s.write_id = w.wid
               WHERE s.run_id = owned.id AND s.kind = 'TOOL') END AS started
FROM owned LEFT JOIN step USING (id) LEFT JOIN done USING (id)""".encode().replace(BY_TEXT, IN_BINARY),
    ("id", "worker", "epoch", "lease", "wid", "request", "response", "stop", "in", "out", "cw", "cr", "cost", "ms",
     "kind", "starts", "again"))

TOOL_STARTS = Shared("start_tool", f"""
WITH w AS (
    SELECT * FROM unnest(%(id)s::uuid[], %(worker)s::text[], %(epoch)s::bigint[], %(lease)s::float8[],
        %(wid)s::uuid[], %(tuid)s::text[], %(name)s::text[], %(request)s::text[], %(again)s::boolean[])
    AS w (id, worker, epoch, lease, wid, tuid, name, request, again)),
{SHARED_FENCE},
done AS (SELECT w.id, d.seq, d.attempts FROM w CROSS JOIN LATERAL (
    SELECT s.seq, s.attempts FROM run_step s WHERE w.again AND s.run_id = w.id AND s.kind = 'TOOL'
        AND s.tool_use_id = w.tuid AND s.write_id = w.wid AND s.status = 'STARTED' LIMIT 1) d),
step AS (
    INSERT INTO run_step (run_id, seq, kind, tool_name, tool_use_id, status, request, worker, write_id)
    SELECT w.id, (SELECT coalesce(max(s.seq), 0) + 1 FROM run_step s WHERE s.run_id = w.id),
        'TOOL', w.name, w.tuid, 'STARTED', w.request, w.worker, w.wid
    FROM w JOIN fence USING (id) WHERE NOT EXISTS (SELECT 1 FROM done WHERE done.id = w.id)
    ON CONFLICT (run_id, tool_use_id) WHERE kind = 'TOOL'
    DO UPDATE SET attempts = run_step.attempts + 1, worker = EXCLUDED.worker, write_id = EXCLUDED.write_id
    WHERE run_step.status = 'STARTED' AND run_step.write_id IS DISTINCT FROM EXCLUDED.write_id
    RETURNING run_id AS id, seq, attempts),
owned AS (
    UPDATE run SET locked_until = now() + make_interval(secs => w.lease)
    FROM w JOIN fence USING (id) WHERE run.id = w.id
    RETURNING run.id, run.tokens_used, run.cost_usd, run.cancel_requested, now() AS db_now,
        run.messages_sent - run.messages_delivered AS messages_waiting)
SELECT coalesce(step.seq, done.seq) AS seq, coalesce(step.attempts, done.attempts) AS attempts, {SHARED_PROGRESS}
FROM owned LEFT JOIN step USING (id) LEFT JOIN done USING (id)""".encode().replace(BY_TEXT, IN_BINARY),
    ("id", "worker", "epoch", "lease", "wid", "tuid", "name", "request", "again"))

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
      AND run_step.run_id = ANY(%(id)s::uuid[]) AND run_step.tool_use_id = ANY(%(tuid)s::text[])
      AND (run_step.status = 'STARTED' OR run_step.write_id = w.wid)
    RETURNING run_step.run_id AS id, run_step.seq),
owned AS (
    UPDATE run SET locked_until = now() + make_interval(secs => w.lease)
    FROM w JOIN fence USING (id) WHERE run.id = w.id
    RETURNING run.id, run.tokens_used, run.cost_usd, run.cancel_requested, now() AS db_now,
        run.messages_sent - run.messages_delivered AS messages_waiting)
SELECT step.seq, {SHARED_PROGRESS} FROM owned LEFT JOIN step USING (id)""".encode().replace(BY_TEXT, IN_BINARY),
    ("id", "worker", "epoch", "lease", "wid", "tuid", "status", "output", "ms"))


class StepWrites(Gateway):
    # -- fenced writes of a held run -----------------------------------------------------------

    async def checkpoint_model(
        self,
        run_id: uuid.UUID,
        worker: str,
        lease_seconds: float,
        turn: ModelTurn,
        *,
        write_id: uuid.UUID | None = None,
        epoch: int | None = None,
        again: bool = False,
        kind: StepKind = StepKind.MODEL,
    ) -> tuple[int, Progress]:
        """The model step row, the token and cost counters, its tenant's usage (tenant_usage) and the lease
        renewal, all or nothing (the claim that took the run cleared its `throttled`). A
        COMPACT step (`kind`) is written the same way: a summarising call is billed like any model call.

        `write_id` names this write: sent again after its outcome was lost with a connection (`again`),
        it finds the step it already wrote instead of appending a second one, and adds no tokens twice.
        Every fenced write takes `epoch`, the lease epoch of the claim it is made under (Run.lease_epoch).
        """
        seq, progress, _ = await self.checkpoint_turn(
            run_id, worker, lease_seconds, turn, write_id=write_id, epoch=epoch, again=again, kind=kind)
        return seq, progress

    async def checkpoint_turn(
        self,
        run_id: uuid.UUID,
        worker: str,
        lease_seconds: float,
        turn: ModelTurn,
        *,
        write_id: uuid.UUID | None = None,
        epoch: int | None = None,
        again: bool = False,
        kind: StepKind = StepKind.MODEL,
        tool_starts: Sequence[tuple[str, str, str]] = (),
    ) -> tuple[int, Progress, int]:
        """`checkpoint_model`, and in the same statement the STARTED rows of `tool_starts`, the turn's calls
        that run next, each (tool_use_id, name, request): what `start_tool` would write for each before it
        runs, one round trip and one commit sooner. They take the seqs after the model step's, in order.
        Returns (seq, progress, how many were STARTED): all of them, or none when the run was asked to stop
        or is past its deadline (then nothing is owed by the write but the model step)."""
        usage = turn.usage
        # Counted only by the write that made the step, not by a copy of it sent again.
        extra = """, tokens_used = run.tokens_used + CASE WHEN EXISTS (SELECT FROM step) THEN %(tokens)s ELSE 0 END,
                   cost_usd = run.cost_usd + CASE WHEN EXISTS (SELECT FROM step) THEN coalesce(%(cost)s, 0) ELSE 0 END,
                   model_retries = 0"""
        row = await self._fenced(
            run_id,
            f"""WITH {FENCE_STARTS},
                done AS (SELECT seq FROM run_step
                         WHERE %(again)s AND run_id = %(id)s AND write_id = %(wid)s AND kind = %(kind)s),
                step AS (
                    INSERT INTO run_step (run_id, seq, kind, status, request, response, stop_reason,
                        input_tokens, output_tokens, cache_creation_input_tokens, cache_read_input_tokens,
                        cost_usd, latency_ms, worker, started_at, finished_at, write_id)
                    SELECT id, (SELECT coalesce(max(seq), 0) + 1 FROM run_step WHERE run_id = %(id)s),
                        %(kind)s, 'DONE', %(request)s, %(response)s, %(stop)s, %(in)s, %(out)s,
                        %(cw)s, %(cr)s, %(cost)s, %(ms)s, %(worker)s,
                        now() - make_interval(secs => %(ms)s / 1000.0), now(), %(wid)s
                    FROM fence WHERE NOT EXISTS (SELECT 1 FROM done)
                    RETURNING seq),
                started AS (
                    INSERT INTO run_step (run_id, seq, kind, tool_name, tool_use_id, status, request, worker,
                                          write_id)
                    SELECT fence.id, step.seq + c.n, {STARTED_ROW}, %(worker)s, %(wid)s
                    FROM step, fence CROSS JOIN LATERAL {ONE_RUN_CALLS}
                    WHERE {STARTABLE}
                    ON CONFLICT (run_id, tool_use_id) WHERE kind = 'TOOL' DO NOTHING
                    RETURNING seq),
                {USED},
                {OWNED.format(extra=extra)}
                SELECT coalesce((SELECT seq FROM step), (SELECT seq FROM done)) AS seq, {PROGRESS},
                    CASE WHEN EXISTS (SELECT FROM done)
                         THEN (SELECT count(*) FROM run_step WHERE run_id = %(id)s AND kind = 'TOOL'
                                                                AND write_id = %(wid)s)
                         ELSE (SELECT count(*) FROM started) END AS started
                FROM owned""",
            {
                "id": run_id, "worker": worker, "lease": lease_seconds, "tokens": usage.total, "cost": turn.cost_usd,
                "request": turn.request, "response": turn.response, "stop": turn.stop_reason,
                "in": usage.input_tokens, "out": usage.output_tokens, "cw": usage.cache_creation_input_tokens,
                "cr": usage.cache_read_input_tokens, "ms": turn.latency_ms, "wid": write_id or uuid.uuid4(),
                "epoch": epoch, "kind": kind.value, "starts": orjson.dumps(tool_starts).decode(), "again": again,
            },
            shared=CHECKPOINTS, again=again,
        )
        if row is None:
            raise LeaseLost(run_id, worker)
        return row["seq"], as_progress(row), int(row["started"])

    async def start_tool(
        self, run_id: uuid.UUID, worker: str, lease_seconds: float, *, write_id: uuid.UUID | None = None,
        epoch: int | None = None, again: bool = False, tool_use_id: str, tool_name: str, request: str,
    ) -> tuple[int, int, Progress]:
        """Write the STARTED row before the tool runs; returns (seq, attempts, progress).

        The tool_use id is the key: after a crash the same row is found again (`attempts` counts the
        executions) instead of a second step being appended; it keeps the first execution's `started_at`
        (a `wait` counts from it: store/waits.py TIMER_SINCE). The same `write_id` sent again (its first
        outcome was lost) counts no second execution.
        """
        row = await self._fenced(
            run_id,
            f"""WITH {FENCE},
                done AS (SELECT seq, attempts FROM run_step
                         WHERE %(again)s AND run_id = %(id)s AND kind = 'TOOL' AND tool_use_id = %(tuid)s
                           AND write_id = %(wid)s AND status = 'STARTED'),
                step AS (
                    INSERT INTO run_step (run_id, seq, kind, tool_name, tool_use_id, status, request, worker,
                                          write_id)
                    SELECT id, (SELECT coalesce(max(seq), 0) + 1 FROM run_step WHERE run_id = %(id)s),
                        'TOOL', %(name)s, %(tuid)s, 'STARTED', %(request)s, %(worker)s, %(wid)s
                    FROM fence WHERE NOT EXISTS (SELECT 1 FROM done)
                    ON CONFLICT (run_id, tool_use_id) WHERE kind = 'TOOL'
                    DO UPDATE SET attempts = run_step.attempts + 1, worker = EXCLUDED.worker,
                                  write_id = EXCLUDED.write_id
                    WHERE run_step.status = 'STARTED' AND run_step.write_id IS DISTINCT FROM EXCLUDED.write_id
                    RETURNING seq, attempts),
                {OWNED.format(extra="")}
                SELECT coalesce(step.seq, done.seq) AS seq, coalesce(step.attempts, done.attempts) AS attempts,
                       {PROGRESS}
                FROM owned LEFT JOIN step ON true LEFT JOIN done ON true""",
            {"id": run_id, "worker": worker, "lease": lease_seconds, "tuid": tool_use_id, "name": tool_name,
             "request": request, "wid": write_id or uuid.uuid4(), "epoch": epoch, "again": again},
            shared=TOOL_STARTS, again=again,
        )
        if row is None:
            raise LeaseLost(run_id, worker)
        if row["seq"] is None:
            raise RuntimeError(f"run {run_id}: tool step {tool_use_id} is already finished")
        return row["seq"], row["attempts"], as_progress(row)

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
        return as_progress(row)

    async def finish(
        self, run_id: uuid.UUID, worker: str, status: RunStatus, error: str | None, *, again: bool = False,
        output: Any = None, epoch: int | None = None, lease_seconds: float | None = None,
    ) -> int | Progress:
        """End a held run; returns its tokens used. locked_by keeps the worker that finished it.

        `again` is for sending the same finish after its outcome was lost: a run this worker already
        ended with that status counts as done rather than as a lost lease.

        A run does not end SUCCEEDED while a message posted to it is undelivered (messages.py): then nothing
        is written but the lease's renewal (`lease_seconds`, when given), and the answer is the run's progress
        now, the run still held, for the driver to deliver them and go on.
        The fence locks the run row first and reads the counters from its newest version, so a message
        whose post committed while this waited for the row is seen.
        """
        assert status.terminal
        params = {"status": status.value, "error": clean(error) if error is not None else None, "id": run_id,
                  "worker": worker, "again": again, "output": Jsonb(output) if output is not None else None,
                  "epoch": epoch, "lease": lease_seconds}
        row = await self._fenced(
            run_id,
            f"""WITH fence AS (
                    SELECT id, %(status)s = 'SUCCEEDED' AND messages_sent <> messages_delivered AS owed,
                           tokens_used, cost_usd, cancel_requested,
                           messages_sent - messages_delivered AS messages_waiting
                    FROM run
                    WHERE id = %(id)s AND locked_by = %(worker)s AND status = 'RUNNING' AND {EPOCH}
                    FOR UPDATE),
                done AS (
                    UPDATE run SET status = %(status)s, error = %(error)s, finished_at = now(), locked_until = NULL,
                                   output = %(output)s
                    FROM fence WHERE run.id = fence.id AND NOT fence.owed
                    RETURNING run.tokens_used),
                renewed AS (
                    UPDATE run SET locked_until = now() + make_interval(secs => %(lease)s::float8)
                    FROM fence WHERE run.id = fence.id AND fence.owed AND %(lease)s::float8 IS NOT NULL
                    RETURNING run.id)
                SELECT coalesce(
                    (SELECT tokens_used FROM done),
                    (SELECT tokens_used FROM run WHERE %(again)s AND id = %(id)s AND locked_by = %(worker)s
                        AND status = %(status)s AND {EPOCH})) AS tokens_used,
                    coalesce((SELECT owed FROM fence), false) AS owed, now() AS db_now,
                    (SELECT tokens_used FROM fence) AS held_tokens, (SELECT cost_usd FROM fence) AS cost_usd,
                    (SELECT cancel_requested FROM fence) AS cancel_requested,
                    (SELECT messages_waiting FROM fence) AS messages_waiting""",
            params, again=again,
        )
        if row is not None and row["tokens_used"] is None and row["owed"]:
            return as_progress({**row, "tokens_used": row["held_tokens"]})
        if row is None or row["tokens_used"] is None:
            raise LeaseLost(run_id, worker)
        return int(row["tokens_used"])

    async def settle_tool(
        self, run_id: uuid.UUID, worker: str, lease_seconds: float, *, write_id: uuid.UUID | None = None,
        epoch: int | None = None, again: bool = False, tool_use_id: str, tool_name: str, request: str, ok: bool,
        output: str, recorded_seq: int | None = None,
    ) -> Progress:
        """Record a tool call's outcome without executing it (a person denied it, or recorded what a call in
        doubt did, or a replay served it from its recording: `recorded_seq`): a finished step, made at once,
        or the call's STARTED row finished. Never executed here, so a new row counts 0 attempts."""
        row = await self._fenced(
            run_id,
            f"""WITH {FENCE},
                step AS (
                    INSERT INTO run_step (run_id, seq, kind, tool_name, tool_use_id, status, request, response,
                                          attempts, worker, finished_at, write_id, recorded_seq)
                    SELECT id, (SELECT coalesce(max(seq), 0) + 1 FROM run_step WHERE run_id = %(id)s),
                        'TOOL', %(name)s, %(tuid)s, %(status)s, %(request)s, %(output)s, 0, %(worker)s, now(), %(wid)s,
                        %(recorded)s
                    FROM fence
                    ON CONFLICT (run_id, tool_use_id) WHERE kind = 'TOOL'
                    DO UPDATE SET status = EXCLUDED.status, response = EXCLUDED.response, worker = EXCLUDED.worker,
                                  finished_at = now(), write_id = EXCLUDED.write_id,
                                  recorded_seq = EXCLUDED.recorded_seq
                    WHERE run_step.status = 'STARTED' OR run_step.write_id = EXCLUDED.write_id
                    RETURNING seq),
                {OWNED.format(extra="")}
                SELECT step.seq, {PROGRESS} FROM owned LEFT JOIN step ON true""",
            {"id": run_id, "worker": worker, "lease": lease_seconds, "tuid": tool_use_id, "name": tool_name,
             "request": request, "status": "DONE" if ok else "ERROR", "output": output,
             "wid": write_id or uuid.uuid4(), "epoch": epoch, "recorded": recorded_seq},
            again=again,
        )
        if row is None:
            raise LeaseLost(run_id, worker)
        if row["seq"] is None:
            raise RuntimeError(f"run {run_id}: tool step {tool_use_id} is already finished")
        return as_progress(row)

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
        return as_progress(row)
