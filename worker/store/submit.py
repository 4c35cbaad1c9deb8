"""Submission: a new run (fresh, continued or forked from another), and a request to cancel one."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Sequence
from typing import Any

import orjson
import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from agentrun.worker.core.errors import OverQuota
from agentrun.worker.core.recording import NewReplay
from agentrun.worker.core.records import (
    NewRun,
    Run,
)
from agentrun.worker.store.children import CANCEL_DESCENDANTS
from agentrun.worker.store.gateway import Gateway
from agentrun.worker.store.groupcommit import Shared
from agentrun.worker.store.insert import INSERT_RUN, run_row
from agentrun.worker.store.rows import RUN_COLUMNS, as_run
from agentrun.worker.store.tenants import admit

# A continued or forked run starts with the steps of its parent, copied and marked inherited: replay
# needs nothing else, and the parent may be pruned later without breaking its child. A continuation
# copies every step and adds the new input as a USER step of its own; a conversation that began as the
# parent's `input` gets that input as a USER step first. A fork copies the first `fork_seq` steps. Tool
# steps left STARTED are copied too: their call is in doubt in the new run as it was in its parent (a call
# of an idempotent tool simply runs again), and the new run asks its own people, not the parent's
# decisions, before it runs one again. So is a STARTED step just past a fork's last step whose call the
# fork still owes (no model or user step between): a fork at the model step that asked for a call in
# doubt must not make that call again unasked. A continuation goes on from a SUCCEEDED run, which owes
# nothing: its STARTED rows, if any, are history only. A parent whose first step is a message posted to it
# (delivered before its first model call) did not begin with a USER step of its own: it gets its opening too.
# The opening moves every copied step one seq up, so the seqs a copied step names move with them: a COMPACT
# step's keepFromSeq and coversSeqs (and, clearing tool results, the seq of each result it cleared) and a
# MODEL step's context.compactedAt. The copy then reads as the run would have written it itself: replay
# keeps the turns the parent kept, and a placeholder names the step of this run that holds its result.
_INHERIT = b"""
WITH parent AS (SELECT id, input FROM run WHERE id = %(parent)s),
opening AS (
    SELECT p.input FROM parent p
    WHERE %(fork_seq)s::int IS NULL
      AND NOT EXISTS (SELECT 1 FROM run_step s WHERE s.run_id = p.id AND s.seq = 1 AND s.kind = 'USER'
                      AND s.request IS DISTINCT FROM 'message')),
copied AS (
    SELECT s.* FROM run_step s JOIN parent p ON s.run_id = p.id
    WHERE %(fork_seq)s::int IS NULL OR s.seq <= %(fork_seq)s
       OR (s.kind = 'TOOL' AND s.status = 'STARTED'
           AND NOT EXISTS (SELECT 1 FROM run_step t WHERE t.run_id = p.id AND t.kind <> 'TOOL'
                           AND t.seq > %(fork_seq)s AND t.seq < s.seq))),
shift AS (SELECT count(*)::int AS n FROM opening),
naming AS MATERIALIZED (  -- each request parsed once, and only those that name seqs
    SELECT c.seq, c.kind, c.request::jsonb AS r, c.response, sh.n FROM copied c CROSS JOIN shift sh
    WHERE sh.n > 0 AND (c.kind = 'COMPACT' OR (c.kind = 'MODEL' AND c.request LIKE '%%"compactedAt"%%'))),
renumbered AS (
    SELECT seq,
           CASE WHEN kind = 'MODEL'
                THEN jsonb_set(r, '{context,compactedAt}', to_jsonb((r #>> '{context,compactedAt}')::int + n))
                ELSE r || jsonb_build_object(
                    'keepFromSeq', to_jsonb((r ->> 'keepFromSeq')::int + n),
                    'coversSeqs', (SELECT jsonb_agg(to_jsonb(x::int + n) ORDER BY i)
                                   FROM jsonb_array_elements_text(r -> 'coversSeqs') WITH ORDINALITY e(x, i)))
           END::text AS request,
           CASE WHEN kind = 'COMPACT' AND r ->> 'strategy' = 'clear_tool_results'
                THEN (SELECT jsonb_agg(CASE WHEN x ? 'seq' THEN x || jsonb_build_object('seq', (x ->> 'seq')::int + n)
                                            ELSE x END ORDER BY i)
                      FROM jsonb_array_elements(response::jsonb) WITH ORDINALITY e(x, i))::text
           END AS response
    FROM naming),
steps AS (
    INSERT INTO run_step (run_id, seq, kind, status, tool_name, tool_use_id, request, response, stop_reason,
        input_tokens, output_tokens, cache_creation_input_tokens, cache_read_input_tokens, cost_usd, latency_ms,
        attempts, worker, started_at, finished_at, inherited, created_by, recorded_seq)
    SELECT %(id)s, 1, 'USER', 'DONE', NULL, NULL, NULL, o.input, NULL, 0, 0, 0, 0, NULL, NULL, 1, NULL, now(), now(),
           true, NULL, NULL FROM opening o
    UNION ALL
    SELECT %(id)s, (SELECT n FROM shift) + row_number() OVER (ORDER BY c.seq), c.kind, c.status, c.tool_name,
           c.tool_use_id, coalesce(rn.request, c.request), coalesce(rn.response, c.response), c.stop_reason,
           c.input_tokens, c.output_tokens, c.cache_creation_input_tokens, c.cache_read_input_tokens, c.cost_usd,
           c.latency_ms, c.attempts, c.worker, c.started_at, c.finished_at, true, c.created_by, c.recorded_seq
    FROM copied c LEFT JOIN renumbered rn ON rn.seq = c.seq
    RETURNING seq),
own AS (
    INSERT INTO run_step (run_id, seq, kind, status, response, started_at, finished_at)
    SELECT %(id)s, (SELECT count(*) FROM steps) + 1, 'USER', 'DONE', %(input)s, now(), now()
    WHERE %(fork_seq)s::int IS NULL
    RETURNING seq)
UPDATE run SET inherited_steps = (SELECT count(*) FROM steps) WHERE id = %(id)s
"""


def _rows_json(rows: list[dict[str, Any]]) -> bytes | str:
    """Runs' rows as JSON for INSERT_RUN's recordset: by orjson (the standard library's encoder was a fortieth of
    the API's CPU a submission, bench/README.md B15), or as before by `json` for what orjson refuses (an
    integer past 64 bits, a lone surrogate, which PostgreSQL then refuses as it did)."""
    try:
        return orjson.dumps(rows)
    except TypeError:
        return json.dumps(rows)


def run_params(new: NewRun) -> dict[str, Any]:
    """The parameters of a run made alone (`insert_run`): its row, and what its inherited steps are copied
    by. Raises ValueError naming the field if a text cannot be stored (store/insert.run_row)."""
    row = run_row(new)
    return {"id": uuid.UUID(row["id"]), "input": new.input, "key": new.idempotency_key, "tenant": new.tenant,
            "runs": Jsonb([row], dumps=_rows_json),
            "parent": new.continue_from or (new.fork_from[0] if new.fork_from else None),
            "fork_seq": new.fork_from[1] if new.fork_from else None}


# A run made alone is the first of its tenant's maybe: the tenant's row is made with it (the claim counts a
# tenant's running runs under that row's lock, and the fair share walks the tenants). A child's tenant is its
# parent's, whose row exists.
KNOWN_TENANT = """WITH known AS (
    INSERT INTO tenant (name) SELECT %(tenant)s WHERE NOT EXISTS (SELECT 1 FROM tenant WHERE name = %(tenant)s)
    ON CONFLICT DO NOTHING)"""
_INSERT = f"{KNOWN_TENANT}\n{INSERT_RUN.format(gate='', returning='r.id')}".encode()


# Runs made alone, many at once (Submissions.create): the runs of a group-commit batch in one statement, each
# made once (ON CONFLICT DO NOTHING: a retry's key, in the table or earlier in the batch, makes nothing). Only
# the runs of tenants without quotas: a tenant with `max_queued` or a daily budget is admitted run by run
# (`admit`, under its lock), so the rows this statement leaves out go that way. Its snapshot reads the
# tenant's quotas as `admit` reads them unlocked when there are none. The rows go in one order, tenant and
# key, so two batches retrying each other's keys wait for each other in that order, never in a circle.
NO_QUOTAS = """WHERE NOT EXISTS (SELECT 1 FROM tenant q WHERE q.name = n.tenant AND (q.max_queued IS NOT NULL
        OR q.tokens_per_day IS NOT NULL OR q.cost_per_day_usd IS NOT NULL))
    ORDER BY n.tenant, n.idempotency_key"""
UNLIMITED_RUNS = INSERT_RUN.format(gate=NO_QUOTAS, returning=RUN_COLUMNS)  # the run as read: no read after
_INSERT_MANY = f"""WITH known AS (
    INSERT INTO tenant (name) SELECT DISTINCT k.tenant FROM jsonb_to_recordset(%(runs)s::jsonb) AS k (tenant text)
    WHERE NOT EXISTS (SELECT 1 FROM tenant WHERE name = k.tenant) ORDER BY k.tenant
    ON CONFLICT DO NOTHING)
{UNLIMITED_RUNS}""".encode()


class _Runs(Shared):
    """The group commit's shared form of _INSERT_MANY: each write's one value is its run's row."""

    def params(self, rows: Sequence[tuple[Any, ...]]) -> dict[str, Any]:
        return {"runs": Jsonb([row[0] for row in rows], dumps=_rows_json)}


INSERT_MANY = _Runs("insert_run", _INSERT_MANY, ("row",))


async def insert_run(cur: psycopg.AsyncCursor[dict[str, Any]], params: dict[str, Any]) -> uuid.UUID | None:
    """Insert the run `params` (run_params) describes in the cursor's transaction, its inherited steps
    too; returns its id, or None if a run with its id or idempotency key exists (nothing inserted).

    Its tenant's quotas admit it first (store/tenants.py `admit`): OverQuota, nothing written, if it is over
    `max_queued` or a daily budget. A sub-agent's child is not made here: it is part of a run admitted
    already (store/children.py), counted as queued but never refused; the budgets hold it before each of its
    model steps as any run."""
    await admit(cur, params["tenant"])
    await cur.execute(_INSERT, params)
    row = await cur.fetchone()
    inserted: uuid.UUID | None = row["id"] if row is not None else None
    if inserted is not None and params["parent"] is not None:
        # In the same transaction: no worker may claim the run before its inherited steps are there.
        await cur.execute(_INHERIT, params)
    return inserted


_CANCEL = b"""WITH asked AS (
    UPDATE run SET cancel_requested = true,
           cancelled_by = CASE WHEN cancel_requested THEN cancelled_by ELSE %(by)s END,
           status = CASE WHEN status IN ('QUEUED', 'WAITING') THEN 'CANCELLED' ELSE status END,
           finished_at = CASE WHEN status IN ('QUEUED', 'WAITING') THEN now() ELSE finished_at END,
           error = CASE WHEN status = 'QUEUED' AND started_at IS NULL THEN 'cancelled before it started'
                        WHEN status = 'QUEUED' THEN 'cancelled while handed back, before a worker resumed it'
                        WHEN status = 'WAITING' AND waiting_for = 'children'
                            THEN 'cancelled while waiting for its sub-agents'
                        WHEN status = 'WAITING' AND waiting_for = 'timer'
                            THEN 'cancelled while waiting (a timer)'
                        WHEN status = 'WAITING' AND waiting_for = 'event'
                            THEN 'cancelled while waiting for event ' || wait_key
                        WHEN status = 'WAITING' THEN 'cancelled while waiting for a decision'
                        ELSE error END
       WHERE id = %(id)s AND status IN ('QUEUED', 'RUNNING', 'WAITING')
       RETURNING id)
SELECT count(*) AS asked FROM asked"""


async def cancel_in(cur: psycopg.AsyncCursor[dict[str, Any]], run_id: uuid.UUID, by: str | None) -> None:
    """Ask a run to stop (Submissions.cancel), in the cursor's transaction: the run and its unfinished
    sub-agents, their whole tree, in one commit with whatever else the transaction does.

    The tree is read in a statement of its own, after the run's row is locked: a spawn that committed while
    the cancel waited for that lock made children this statement's snapshot shows (a spawn after it sees
    the ask, and makes none). Not only when the run waits for its children: a held run may be spawning."""
    await cur.execute(_CANCEL, {"id": run_id, "by": by})
    row = await cur.fetchone()
    if row is not None and row["asked"] > 0:
        await cur.execute(CANCEL_DESCENDANTS.encode(),
                          {"id": run_id, "by": by, "reason": "cancelled with its parent run"})


# The run a retry names (its id, or its tenant's Idempotency-Key), made by the first copy.
_FIRST = """SELECT id FROM run WHERE id = %(id)s
    OR (%(key)s::text IS NOT NULL AND tenant = %(tenant)s AND idempotency_key = %(key)s)"""

# The same, read whole: one query for a retry answered from the batch (Submissions._made_with_others).
_FIRST_RUN = f"""SELECT {RUN_COLUMNS} FROM run r WHERE r.id = %(id)s
    OR (%(key)s::text IS NOT NULL AND r.tenant = %(tenant)s AND r.idempotency_key = %(key)s)"""

# A replay, made with its runs (Submissions.create_replay); a replay whose id or (tenant, Idempotency-Key) is
# taken already is left as it is, and no run is made.
_INSERT_REPLAY = """INSERT INTO replay (id, tenant, created_by, request, tool_policy, scorer, from_seq, idempotency_key)
    VALUES (%(id)s, %(tenant)s, %(created_by)s, %(request)s, %(tool_policy)s, %(scorer)s, %(from_seq)s, %(key)s)
    ON CONFLICT DO NOTHING
    RETURNING id"""

# The replay a retry names (its id, or its tenant's Idempotency-Key), made by the first copy.
_FIRST_REPLAY = """SELECT id FROM replay WHERE id = %(id)s
    OR (%(key)s::text IS NOT NULL AND tenant = %(tenant)s AND idempotency_key = %(key)s)"""

CANCEL_ATTEMPTS = 5
"""How often a cancel is tried when PostgreSQL breaks a deadlock with a child's end by failing it."""


class Submissions(Gateway):
    async def create(self, new: NewRun) -> tuple[Run, bool]:
        """Insert a run; returns it and whether it is new.

        A run with the same id (the operator retrying) or the same idempotency key (a client retrying)
        is returned as it is instead of a second one being made. Raises ValueError naming the field
        if a text cannot be stored (a NUL character, a lone surrogate): the caller's input, refused
        whole rather than changed. Raises OverQuota if its tenant's quotas refuse a new run, unless it is
        a retry of one made already: that one is returned.
        """
        params = run_params(new)
        if params["parent"] is None:  # no steps to inherit in its transaction: it may go with others
            batched = await self._made_with_others(params)
            if batched is not None:
                return batched
        try:
            async with self.pool.connection() as conn, conn.transaction():
                cur = conn.cursor(row_factory=dict_row)
                inserted = await insert_run(cur, params)
        except OverQuota:
            if (first := await self._one(_FIRST, params)) is None or (run := await self.get(first["id"])) is None:
                raise
            return run, False
        if inserted is not None:
            run = await self.get(inserted)
            assert run is not None
            return run, True
        # The conflicting row may have been committed after this statement's snapshot: look again.
        found = await self._one(_FIRST, params)
        run = await self.get(found["id"]) if found else None
        if run is None:
            raise RuntimeError("run insert conflicted on a key that names no run")
        return run, False

    async def _made_with_others(self, params: dict[str, Any]) -> tuple[Run, bool] | None:
        """The run of `params` made in a batch of submissions (INSERT_MANY, group-committed), or the run its
        retry names; None when the batch left it to be admitted on its own (its tenant has quotas), or the
        batch failed (the run, made or not, is then looked for by its id on the way that follows).

        A copy of a submission this process is sending now (its tenant and Idempotency-Key) is answered
        with the run the first copy's batch made: not written as a row the batch leaves out, then read."""
        key = (params["tenant"], params["key"]) if params["key"] is not None else None
        if key is not None and (first := self.submitting.get(key)) is not None:
            made_first = await asyncio.shield(first)  # this copy may give up; the first's answer goes on
            if made_first is not None:
                return made_first, False
            # The first was not made by its batch: this copy goes the way the first goes, and finds it.
        sending = key if key is not None and key not in self.submitting else None
        if sending is not None:
            self.submitting[sending] = asyncio.get_running_loop().create_future()
        made: Run | None = None
        try:
            row = params["runs"].obj[0]
            try:
                found = await self.inserts.write(params["id"], _INSERT_MANY, {"runs": params["runs"]},
                                                 (INSERT_MANY, (row,)))
            except psycopg.Error:
                return None
            if found is not None:
                made = as_run(found)
                return made, True
        finally:
            if sending is not None:
                self.submitting.pop(sending).set_result(made)
        # Not made: a run with its key or id was there (committed before this statement's snapshot or
        # while it waited), or its tenant has quotas.
        first_row = await self._one(_FIRST_RUN, params)
        return (as_run(first_row), False) if first_row is not None else None

    async def first_replay(self, replay: NewReplay, tenant: str) -> uuid.UUID | None:
        """The replay made already with `replay`'s id or its tenant's Idempotency-Key, if any."""
        found = await self._one(_FIRST_REPLAY, {"id": replay.id, "key": replay.idempotency_key, "tenant": tenant})
        return found["id"] if found is not None else None

    async def create_replay(
        self, replay: NewReplay, tenant: str, created_by: str | None, runs: list[NewRun],
    ) -> tuple[uuid.UUID, bool]:
        """Insert a replay and its runs in one transaction: all of them, or nothing. Returns the replay's id
        and whether this call made it; a replay with the same id or (tenant, Idempotency-Key) is returned
        instead, and no run made. Each run is admitted by its tenant's quotas as any run (`insert_run`):
        OverQuota if one is refused, nothing written. Raises ValueError naming the field of a text that
        cannot be stored, as `create`."""
        params = [run_params(new) for new in runs]
        replay_params = {"id": replay.id, "tenant": tenant, "created_by": created_by, "request": Jsonb(replay.request),
                         "tool_policy": replay.tool_policy.value, "scorer": replay.scorer,
                         "from_seq": replay.from_seq, "key": replay.idempotency_key}
        async with self.pool.connection() as conn, conn.transaction():
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(_INSERT_REPLAY.encode(), replay_params)
            made = await cur.fetchone() is not None
            if made:
                for p in params:
                    if await insert_run(cur, p) is None:
                        raise RuntimeError(f"replay run {p['id']} conflicts with a run made before")
        if made:
            return replay.id, True
        # The conflicting row may have been committed after this statement's snapshot: look again.
        first = await self.first_replay(replay, tenant)
        if first is None:
            raise RuntimeError("replay insert conflicted on a key that names no replay")
        return first, False

    async def cancel(self, run_id: uuid.UUID, by: str | None = None) -> Run | None:
        """Ask a run to stop: a run no worker drives (queued, scheduled, handed back to wait out a backoff, or
        waiting for a decision) ends CANCELLED at once, a running one within moments
        (the holder hears of it by notification and interrupts the step in flight).

        Returns the run afterwards, or None if there is no such run. A finished run is left as it is.
        `by` is recorded as `cancelled_by` unless someone asked before.
        """
        for attempt in range(CANCEL_ATTEMPTS):
            try:
                async with self.pool.connection() as conn, conn.transaction():
                    await cancel_in(conn.cursor(row_factory=dict_row), run_id, by)
                break
            except psycopg.errors.DeadlockDetected:
                # It locks the run's row, then its children's; a child's end locks its own, then its parent's
                # (store/children.py). Met halfway, PostgreSQL fails one of the two, rolled back whole: asking
                # again is safe (the first to ask stays `cancelled_by`), and the child has ended by then.
                if attempt == CANCEL_ATTEMPTS - 1:
                    raise
                await asyncio.sleep(0.01 * 2 ** attempt)
        return await self.get(run_id)
