"""Claims and leases: which worker drives a run, for how long, and when it gives it back."""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
from psycopg.rows import dict_row

from agentrun.worker.core.records import (
    Progress,
)
from agentrun.worker.store.channels import LIVENESS_LOCK_CLASS, WAKE_CHANNEL
from agentrun.worker.store.gateway import Gateway
from agentrun.worker.store.rows import (
    EPOCH,
    RUN_COLUMNS,
    Claim,
    as_run,
)

LOCK_LIMITED = """SELECT set_config('plan_cache_mode', 'force_generic_plan', true),
    set_config('agentrun.claim_tenants', (SELECT coalesce(string_agg(name, ','), '') FROM (
        SELECT t.name FROM tenant t
        WHERE t.max_running IS NOT NULL
          AND (SELECT true FROM run WHERE run.tenant = t.name AND run.status = 'QUEUED' AND run.run_at <= now()
               ORDER BY run.priority DESC, run.run_at LIMIT 1)
          AND t.max_running > (SELECT count(*) FROM run WHERE run.tenant = t.name AND run.status = 'RUNNING')
        FOR UPDATE OF t SKIP LOCKED) locked), true)"""
"""A claim's first statement: lock the rows of the tenants with a `max_running`, runs queued and (as far as
this snapshot sees) a slot free, skipping those another claim holds; their names go to the transaction's
`agentrun.claim_tenants` for the claim (`FAIR_SHARE`), which may take their queued runs only while it holds
them: no other claim can then take one, so the running runs it counts are all there are. A tenant another
claim holds is skipped this round, never waited for; that claim wakes the workers if it leaves the tenant
room and runs to take (`wake`). It also makes the claim run on its generic plan, once prepared: planning
the claim took longer than running it (about 2 of 4 ms a claim, one tenant, 100,000 queued), and its
plan does not depend on the values bound (each index it takes is the only one that gives its order).

Whether a tenant has runs due is a scalar subquery in the order of run_tenant_queued_idx, not an EXISTS: the
planner made the EXISTS a semi-join that hashed every queued run of the table before it looked at a single
tenant, so each claim cost a read of the whole backlog (5 ms at 20,000 queued, B11), limited tenants or not."""

SLACK = 8
"""Runs a claim looks at beyond the `limit` it may take: claims at the same moment want the same first runs,
and one that finds them locked takes the next ones instead. With 4, of eight claimers of one run each at
once (B5), one claim in fourteen (one tenant) to one in six (100 tenants) found all its runs taken and
claimed again deeper; with 8, none did."""
DEEPER = 8
"""A claim that still found its runs taken by others looks this many times as deep once more."""

SUSPECTED = """EXISTS (SELECT 1 FROM worker_suspect ws WHERE ws.worker = r.locked_by
                        AND ws.since <= now() - make_interval(secs => %(grace)s))"""
"""The holder of run `r` has had its liveness lock free for the grace: it looks dead."""

FAIR_SHARE = f"""WITH RECURSIVE walk AS (
        (SELECT tenant, priority, run_at FROM run WHERE status = 'QUEUED' AND run_at <= now()
         ORDER BY tenant, priority DESC, run_at LIMIT 1)
        UNION ALL
        SELECT n.* FROM walk w CROSS JOIN LATERAL (
            SELECT tenant, priority, run_at FROM run
            WHERE run.status = 'QUEUED' AND run.run_at <= now() AND run.tenant > w.tenant
            ORDER BY run.tenant, run.priority DESC, run.run_at LIMIT 1) n),
    tenants AS (
        SELECT w.tenant AS name, w.priority, w.run_at, coalesce(t.weight, 1) AS weight, n.running,
               CASE WHEN t.max_running IS NULL THEN NULL
                    WHEN t.name = ANY(string_to_array(current_setting('agentrun.claim_tenants', true), ','))
                        THEN greatest(t.max_running - n.running, 0)
                    ELSE 0 END AS room
        FROM walk w LEFT JOIN tenant t ON t.name = w.tenant CROSS JOIN LATERAL (
            SELECT count(*) AS running FROM run WHERE run.tenant = w.tenant AND run.status = 'RUNNING') n),
    picked AS (
        SELECT name, weight, running, room,
               row_number() OVER (ORDER BY priority DESC, (running + 1) / weight, run_at) AS pos
        FROM tenants WHERE room IS DISTINCT FROM 0
        ORDER BY pos LIMIT %(window)s),
    queued AS (
        SELECT q.id, q.priority, q.run_at, p.name AS tenant, p.room,
               row_number() OVER (PARTITION BY p.name ORDER BY q.priority DESC, q.run_at) AS rank,
               (p.running + row_number() OVER (PARTITION BY p.name ORDER BY q.priority DESC, q.run_at))
                   / p.weight AS vt
        FROM picked p CROSS JOIN LATERAL (
            SELECT id, priority, run_at FROM run
            WHERE run.tenant >= p.name AND run.tenant <= p.name AND run.status = 'QUEUED' AND run.run_at <= now()
            ORDER BY run.tenant, run.priority DESC, run.run_at
            LIMIT CASE WHEN p.room IS NULL THEN %(window)s - p.pos + 1 ELSE least(%(limit)s, p.room) + 1 END) q),
    candidates AS (
        SELECT id, priority, run_at, vt, tenant, true AS queued FROM queued WHERE room IS NULL OR rank <= room
        UNION ALL
        SELECT r.id, r.priority, r.run_at, 0.0, r.tenant, false FROM run r
        WHERE r.status = 'RUNNING' AND r.run_at <= now()
          AND (r.locked_until < now() OR (%(liveness)s AND {SUSPECTED}))),
    ranked AS (
        SELECT (array_agg(id ORDER BY priority DESC, vt, run_at))[:%(window)s] AS ids,
               (array_agg(vt ORDER BY priority DESC, vt, run_at))[:%(window)s] AS vts,
               (array_agg(tenant ORDER BY priority DESC, vt, run_at))[:%(window)s] AS tenants
        FROM candidates),
    next AS (
        SELECT r.id, c.tenant, c.vt, CASE WHEN r.status = 'RUNNING' THEN r.locked_by END AS taken_from
        FROM ranked, unnest(ranked.ids, ranked.vts, ranked.tenants) WITH ORDINALITY AS c (id, vt, tenant, pos)
        JOIN run r ON r.id = c.id
        WHERE r.run_at <= now() AND r.status IN ('QUEUED', 'RUNNING') AND CASE
              WHEN r.status = 'QUEUED' OR r.locked_until < now() THEN true
              WHEN NOT %(liveness)s THEN false
              WHEN NOT {SUSPECTED} THEN false
              ELSE pg_try_advisory_xact_lock(%(lock_class)s, hashtext(r.locked_by)) END
        ORDER BY c.pos FOR UPDATE OF r SKIP LOCKED LIMIT %(limit)s),
    wake AS (
        SELECT pg_notify(%(wake)s, '') FROM tenants t
        WHERE t.room > 0 AND EXISTS (SELECT 1 FROM next)
          AND (SELECT count(*) FROM next WHERE next.tenant = t.name AND next.taken_from IS NULL) < t.room
          AND greatest((SELECT count(*) FROM queued q WHERE q.tenant = t.name), 1)
              > (SELECT count(*) FROM next WHERE next.tenant = t.name AND next.taken_from IS NULL)
        LIMIT 1),
    claimed AS (
        UPDATE run r SET status = 'RUNNING', locked_by = %(worker)s, lease_epoch = r.lease_epoch + 1,
               locked_until = now() + make_interval(secs => %(lease)s),
               started_at = coalesce(r.started_at, now()), claims = r.claims + 1,
               crashes = r.crashes + CASE WHEN r.status = 'RUNNING' AND NOT r.handed_back THEN 1 ELSE 0 END,
               handed_back = false, throttled = NULL
        FROM next WHERE r.id = next.id
        RETURNING {RUN_COLUMNS}, now() AS db_now, next.taken_from, next.vt AS claim_vt)
    SELECT claimed.*, (SELECT count(*) FROM candidates WHERE queued) AS offered, (SELECT count(*) FROM wake) AS woke
    FROM (VALUES (1)) AS one LEFT JOIN claimed ON true"""
"""A claim's second statement. The tenants with runs due come from a walk over run_tenant_queued_idx (one
probe a tenant with work, none for the others; a tenant with no row has weight 1 and no limit), each with
its first run (priority DESC, run_at). Runs are ranked by priority, then a virtual time, (its tenant's
running runs + the run's rank among its own) / its weight, then age: the tenant furthest below its share
goes first, so a tenant with 5 runs queued is not served after one with 20,000. A tenant's first run ranks
before its others, so the first `window` runs of that order are all of the first `window` tenants ordered
by their first run (`picked`): only those are read further, the one at place p for at most `window` - p + 1
runs, or as many as the claim may take (+ 1) of a tenant it holds with room; none of a limited tenant it
does not hold. The range on `tenant` keeps the planner on that index (an equality would let it walk
run_claim_priority_idx, filtering every other tenant's runs out: 13,000 rows a probe in B11). Only the
first `window` are locked (in that order, by id: a join the planner could hash). Runs to take over (a
lapsed lease, a dead holder) go first within their priority. A claim that leaves a tenant it held with
room and runs it did not take (its batch was full, or the tenant not picked) wakes the workers (`wake`),
since a claim that skipped the tenant may have found nothing and gone idle."""


class Claims(Gateway):
    # -- the lease -------------------------------------------------------------------------------

    async def claim(
        self, worker: str, lease_seconds: float, liveness: bool = False, liveness_grace: float = 1.0
    ) -> Claim | None:
        """Take the one claimable run that comes first (`claim_many` for one)."""
        claims = await self.claim_many(worker, lease_seconds, liveness, liveness_grace, limit=1)
        return claims[0] if claims else None

    async def claim_many(
        self, worker: str, lease_seconds: float, liveness: bool = False, liveness_grace: float = 1.0, *,
        limit: int = 1,
    ) -> list[Claim]:
        """Take up to `limit` claimable runs in one transaction and one round trip: queued, or running
        under a lease that has lapsed, and whose `run_at` has come. Highest priority first; within a
        priority, the workers are shared among the tenants with runs waiting by weight (`FAIR_SHARE`),
        and a tenant never has more runs RUNNING than its `max_running` (`LOCK_LIMITED`).

        With `liveness`, also a running run whose worker is dead: its liveness lock (presence.py) is free,
        and has stayed free for `liveness_grace` seconds since a claim first found it so (`suspect`). A
        live worker whose connection dropped takes its lock back within that grace, so only a worker that
        is gone loses its runs early. The CASE keeps the lock attempt to RUNNING candidates with a live
        lease whose holder is suspected, and runs it last. A takeover needs no slot of its tenant: the
        run was counted as running already.
        """
        chosen, offered = await self._claim_some(worker, lease_seconds, liveness, liveness_grace, limit, limit + SLACK)
        if len(chosen) < limit and offered > len(chosen):
            # Runs it was offered were being taken by other claims at the same moment: look further down.
            more, _ = await self._claim_some(
                worker, lease_seconds, liveness, liveness_grace, limit - len(chosen), (limit + SLACK) * DEEPER
            )
            chosen += more
        # In the order they were chosen (UPDATE … RETURNING keeps no order of its own).
        chosen.sort(key=lambda vc: (-vc[1].run.priority, vc[0], vc[1].run.run_at or vc[1].progress.db_now))
        return [c for _, c in chosen]

    async def _claim_some(
        self, worker: str, lease_seconds: float, liveness: bool, liveness_grace: float, limit: int, window: int
    ) -> tuple[list[tuple[float, Claim]], int]:
        """One claim: the runs taken, each with its virtual time, and how many queued runs it was offered."""
        params = {"worker": worker, "lease": lease_seconds, "liveness": liveness, "lock_class": LIVENESS_LOCK_CLASS,
                  "grace": liveness_grace, "limit": limit, "window": window, "wake": WAKE_CHANNEL}
        async with self.pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            sent_at = time.monotonic()
            # Two statements, so the second's snapshot is taken once the first holds its tenants' locks:
            # it sees every run another claim of those tenants made and committed before letting go.
            async with conn.pipeline(), conn.transaction():
                await conn.execute(LOCK_LIMITED.encode())
                await cur.execute(FAIR_SHARE.encode(), params)
            rows = await cur.fetchall()
        chosen = []
        offered = 0
        for row in rows:  # one row even when nothing was taken: what was offered
            offered = row.pop("offered")
            db_now = row.pop("db_now")
            taken_from = row.pop("taken_from")
            vt = row.pop("claim_vt")
            row.pop("woke")
            if row["id"] is None:
                continue
            run = as_run(row)
            chosen.append((vt, Claim(
                run, Progress(run.tokens_used, run.cost_usd, run.cancel_requested, db_now,
                              run.messages_sent - run.messages_delivered), taken_from, sent_at
            )))
        return chosen, offered

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


# A worker's presence connection (runtime/presence.py) holds its liveness lock for as long as it lives;
# claims of its runs try the lock (above) before they take one over.


async def take_liveness_lock(conn: psycopg.AsyncConnection[Any], worker: str) -> bool:
    """Take `worker`'s liveness lock on this session; False if another live session holds it."""
    cur = await conn.execute("SELECT pg_try_advisory_lock(%s, hashtext(%s))", (LIVENESS_LOCK_CLASS, worker))
    row = await cur.fetchone()
    return bool(row and row[0])


async def clear_suspicion(conn: psycopg.AsyncConnection[Any], worker: str) -> None:
    """Holding its lock again: whoever found it free while the worker was away must not take its runs."""
    await conn.execute("DELETE FROM worker_suspect WHERE worker = %s", (worker,))
