"""Tenants' quotas: set and read them with what each tenant uses now, admit a new run under them, and hand a
held run back while its tenant's daily budget is spent."""

from __future__ import annotations

import datetime
import math
import uuid
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from agentrun.worker.core.errors import OverQuota
from agentrun.worker.core.tenants import Quotas, Tenant, Throttle, over_budget
from agentrun.worker.store.channels import QUOTA_LOCK_CLASS
from agentrun.worker.store.gateway import Gateway
from agentrun.worker.store.rows import EPOCH

QUEUE_FULL_RETRY = 10.0
"""The Retry-After of a submit refused for a full queue, in seconds: no clock says when a queued run starts,
so a guess, long enough that a client looping on it does not hammer the API."""

# What each tenant of %(names)s spent over the last 1,440 minutes (the minute now and the 1,439 before it),
# and when each daily budget allows again: the minute at which what stays in the window after it is under
# the budget, plus a day (that minute leaves the window then). `%(all)s` false: only tenants with a budget
# sum their usage (the others get zeros).
BUDGETS = """WITH t AS (
    SELECT name, tokens_per_day, cost_per_day_usd FROM tenant WHERE name = ANY(%(names)s::text[])),
u AS (
    SELECT tu.tenant, tu.minute, sum(tu.tokens) AS tokens, sum(tu.cost_usd) AS cost
    FROM tenant_usage tu JOIN t ON t.name = tu.tenant
    WHERE tu.minute > date_trunc('minute', now()) - interval '1 day'
      AND (%(all)s OR t.tokens_per_day IS NOT NULL OR t.cost_per_day_usd IS NOT NULL)
    GROUP BY tu.tenant, tu.minute),
c AS (
    SELECT tenant, minute, sum(tokens) OVER whole AS tokens, sum(cost) OVER whole AS cost,
        sum(tokens) OVER whole - sum(tokens) OVER upto AS tokens_after,
        sum(cost) OVER whole - sum(cost) OVER upto AS cost_after
    FROM u WINDOW whole AS (PARTITION BY tenant), upto AS (PARTITION BY tenant ORDER BY minute))
SELECT t.name, coalesce(max(c.tokens), 0)::bigint AS tokens, coalesce(max(c.cost), 0) AS cost,
    min(c.minute) FILTER (WHERE c.tokens_after < t.tokens_per_day) + interval '1 day' AS tokens_until,
    min(c.minute) FILTER (WHERE c.cost_after < t.cost_per_day_usd) + interval '1 day' AS cost_until,
    now() AS db_now
FROM t LEFT JOIN c ON c.tenant = t.name GROUP BY t.name"""

# A submit's first statement in its transaction: the tenant's limits, and, only for a tenant with a
# `max_queued`, the lock that makes count-then-insert exact against the tenant's other submits (held to the
# transaction's end; a tenant without one pays no lock). An advisory lock, not the tenant's row: the claims
# lock that row to count running runs, and a submit need not wait for them.
LIMITS = """SELECT max_queued, tokens_per_day, cost_per_day_usd,
    CASE WHEN max_queued IS NOT NULL THEN pg_advisory_xact_lock(%(lock_class)s, hashtext(name)) IS NULL END AS locked
FROM tenant WHERE name = %(tenant)s"""

# Read after the lock, in a statement of its own: its snapshot sees every run the submits before it committed.
QUEUED = "SELECT count(*) AS queued FROM run WHERE tenant = %(tenant)s AND status = 'QUEUED'"

# Each tenant's unfinished runs, counted (of the tenant %(name)s only, unless NULL): queued, running, waiting,
# the queued ones a daily budget holds back (`held`) and the queued ones due (`ready`). One pass over them for
# the tenants' API and the metrics alike.
RUN_COUNTS = """SELECT tenant, count(*) FILTER (WHERE status = 'QUEUED') AS queued,
        count(*) FILTER (WHERE status = 'RUNNING') AS running,
        count(*) FILTER (WHERE status = 'WAITING') AS waiting,
        count(*) FILTER (WHERE status = 'QUEUED' AND throttled IS NOT NULL) AS held,
        count(*) FILTER (WHERE status = 'QUEUED' AND run_at <= now()) AS ready
    FROM run WHERE status IN ('QUEUED', 'RUNNING', 'WAITING') AND (%(name)s::text IS NULL OR tenant = %(name)s)
    GROUP BY tenant"""

TENANTS = f"""WITH t AS (SELECT * FROM tenant WHERE %(name)s::text IS NULL OR name = %(name)s),
counts AS ({RUN_COUNTS})
SELECT t.name, t.max_running, t.max_queued, t.tokens_per_day, t.cost_per_day_usd, t.weight, t.configured_at,
    t.updated_at, coalesce(c.queued, 0) AS queued, coalesce(c.running, 0) AS running,
    coalesce(c.held, 0) AS throttled
FROM t LEFT JOIN counts c ON c.tenant = t.name ORDER BY t.name"""

# Each tenant's load for the metrics gauges: its runs counted as RUN_COUNTS has them, the queued ones its quotas
# hold back (marked by a daily budget, or due while the tenant is at its max_running), and what it spent over
# the rolling last day (a plain sum: the gauges need no budget's window).
LOAD = f"""WITH counts AS ({RUN_COUNTS}),
    spent AS (
        SELECT tenant, sum(tokens) AS tokens, sum(cost_usd) AS cost_usd FROM tenant_usage
        WHERE minute > now() - interval '1 day' GROUP BY tenant)
    SELECT t.name AS tenant, coalesce(c.queued, 0) AS queued, coalesce(c.running, 0) AS running,
           coalesce(c.waiting, 0) AS waiting, coalesce(s.tokens, 0) AS tokens, coalesce(s.cost_usd, 0) AS cost_usd,
           CASE WHEN t.max_running IS NOT NULL AND coalesce(c.running, 0) >= t.max_running
                THEN greatest(coalesce(c.ready, 0), coalesce(c.held, 0)) ELSE coalesce(c.held, 0) END AS throttled
    FROM tenant t LEFT JOIN counts c ON c.tenant = t.name LEFT JOIN spent s ON s.tenant = t.name
    ORDER BY t.name"""

SET_QUOTAS = """INSERT INTO tenant AS t (name, max_running, max_queued, tokens_per_day, cost_per_day_usd, weight,
    configured_at)
VALUES (%(name)s, %(max_running)s, %(max_queued)s, %(tokens_per_day)s, %(cost_per_day_usd)s, %(weight)s, now())
ON CONFLICT (name) DO UPDATE SET max_running = EXCLUDED.max_running, max_queued = EXCLUDED.max_queued,
    tokens_per_day = EXCLUDED.tokens_per_day, cost_per_day_usd = EXCLUDED.cost_per_day_usd,
    weight = EXCLUDED.weight, configured_at = now(), updated_at = now()
RETURNING t.name"""

# The chart's quotas: for tenants never set through the API or the CLI only (configured_at stays NULL, so the
# next rollout's values apply again; a tenant set through the API keeps its own).
SEED_QUOTAS = """INSERT INTO tenant AS t (name, max_running, max_queued, tokens_per_day, cost_per_day_usd, weight)
SELECT s.name, s.max_running, s.max_queued, s.tokens_per_day, s.cost_per_day_usd, s.weight
FROM jsonb_to_recordset(%(seeds)s::jsonb) AS s (name text, max_running int, max_queued int, tokens_per_day bigint,
    cost_per_day_usd numeric, weight float8)
ON CONFLICT (name) DO UPDATE SET max_running = EXCLUDED.max_running, max_queued = EXCLUDED.max_queued,
    tokens_per_day = EXCLUDED.tokens_per_day, cost_per_day_usd = EXCLUDED.cost_per_day_usd,
    weight = EXCLUDED.weight, updated_at = now()
WHERE t.configured_at IS NULL
RETURNING t.name"""

# A held run handed back until its tenant's budget allows again: QUEUED, no holder, claimable at `until` (its
# deadline, if sooner: a claim then ends it TIMED_OUT), with why it waits. Fenced like every write to a held
# run; a copy sent again finds the run handed back under the same epoch.
THROTTLE = f"""WITH throttled AS (
    UPDATE run SET status = 'QUEUED', locked_by = NULL, locked_until = NULL, handed_back = true,
        run_at = least(greatest(%(until)s::timestamptz, now()), deadline_at), throttled = %(throttled)s
    WHERE id = %(id)s AND locked_by = %(worker)s AND status = 'RUNNING' AND {EPOCH}
    RETURNING id)
SELECT coalesce(
    (SELECT id FROM throttled),
    (SELECT id FROM run WHERE id = %(id)s AND %(epoch)s::bigint IS NOT NULL
        AND lease_epoch = %(epoch)s::bigint AND handed_back AND locked_by IS NULL)) AS id"""


def _quotas(row: Mapping[str, Any]) -> Quotas:
    cost = row["cost_per_day_usd"]
    return Quotas(row["max_running"], row["max_queued"], row["tokens_per_day"],
                  Decimal(cost) if cost is not None else None, float(row["weight"]))


def _budget(quotas: Quotas, row: Mapping[str, Any] | None) -> Throttle | None:
    if row is None:
        return None
    day_later = row["db_now"] + datetime.timedelta(days=1)  # a budget of 0: the whole window must pass
    return over_budget(quotas, int(row["tokens"]), Decimal(row["cost"]), row["tokens_until"] or day_later,
                       row["cost_until"] or day_later)


def retry_after(until: datetime.datetime | None, now: datetime.datetime) -> float:
    """Seconds from `now` to `until` (rounded up, at least 1); QUEUE_FULL_RETRY when no clock says."""
    if until is None:
        return QUEUE_FULL_RETRY
    return float(max(1, math.ceil((until - now).total_seconds())))


async def admit(cur: psycopg.AsyncCursor[dict[str, Any]], tenant: str) -> None:
    """Refuse (OverQuota) a new run of `tenant` that its quotas do not admit now, in the transaction that
    inserts it: over `max_queued` counting its QUEUED runs (delayed, scheduled and handed-back ones too), or
    at or over a daily budget. A tenant with a `max_queued` stays locked until the transaction ends, so
    concurrent submits count each other's runs and never overshoot it. A tenant without quotas (or without a
    row yet: its first run) costs one read of its row."""
    await cur.execute(LIMITS.encode(), {"tenant": tenant, "lock_class": QUOTA_LOCK_CLASS})
    row = await cur.fetchone()
    if row is None or (row["max_queued"] is None and row["tokens_per_day"] is None
                       and row["cost_per_day_usd"] is None):
        return
    quotas = _quotas({**row, "max_running": None, "weight": 1.0})
    if quotas.max_queued is not None:
        await cur.execute(QUEUED.encode(), {"tenant": tenant})
        counted = await cur.fetchone()
        queued = int(counted["queued"]) if counted else 0
        if queued >= quotas.max_queued:
            raise OverQuota("maxQueued", QUEUE_FULL_RETRY,
                            f"tenant {tenant!r} has {queued} runs queued, its maxQueued is {quotas.max_queued}")
    if quotas.tokens_per_day is None and quotas.cost_per_day_usd is None:
        return
    await cur.execute(BUDGETS.encode(), {"names": [tenant], "all": False})
    used = await cur.fetchone()
    over = _budget(quotas, used)
    if over is not None and used is not None:
        raise OverQuota(over.quota, retry_after(over.until, used["db_now"]), f"tenant {tenant!r}: {over.reason}")


class Tenants(Gateway):
    """Tenants' quotas and usage (issue 46). A change is read by the next submit and, within a second, by
    every worker's check before a model step (runtime/quotas.py): nothing caches them longer."""

    async def tenants(self, name: str | None = None) -> list[Tenant]:
        """Every tenant (or the one named), by name, with its runs queued and running and its usage over the
        last 1,440 minutes, and the quota it is over now, if any."""
        rows = await self._all(TENANTS, {"name": name})
        if not rows:
            return []
        usage = {r["name"]: r for r in await self._all(BUDGETS, {"names": [r["name"] for r in rows], "all": True})}
        found = []
        for row in rows:
            quotas = _quotas(row)
            used = usage.get(row["name"])
            over = _budget(quotas, used)
            if over is None and quotas.max_queued is not None and row["queued"] >= quotas.max_queued:
                over = Throttle("maxQueued", None, f"{row['queued']} runs queued, its maxQueued is "
                                f"{quotas.max_queued}")
            found.append(Tenant(
                row["name"], quotas, queued=row["queued"], running=row["running"],
                tokens_today=int(used["tokens"]) if used else 0,
                cost_today_usd=Decimal(used["cost"]) if used else Decimal(0), throttled=row["throttled"],
                over=over, configured_at=row["configured_at"], updated_at=row["updated_at"],
            ))
        return found

    async def count_by_tenant(self) -> list[dict[str, Any]]:
        """Each tenant's load, for the metrics gauges (LOAD): `tenant`, its runs `queued`, `running` and
        `waiting`, the queued ones its quotas hold back (`throttled`), and the `tokens` and `cost_usd` of the
        rolling last day."""
        return await self._all(LOAD, {"name": None})

    async def tenant(self, name: str) -> Tenant | None:
        """The tenant named, as `tenants` has it; None if it has no row (no run of it yet, never set)."""
        found = await self.tenants(name)
        return found[0] if found else None

    async def set_quotas(self, name: str, quotas: Quotas) -> Tenant:
        """Set a tenant's quotas and weight, all of them (None: no limit), making its row if need be. The next
        submit reads them; every worker within a second. ValueError naming the field for a value the tenant
        table refuses (a negative limit, a weight out of (0, 1000])."""
        if problems := quotas.problems():
            raise ValueError("; ".join(f"{f}: {p}" for f, p in problems))
        await self._all(SET_QUOTAS, _params(name, quotas))
        found = await self.tenant(name)
        assert found is not None
        return found

    async def seed_quotas(self, quotas: Mapping[str, Quotas]) -> list[str]:
        """The chart's initial quotas (AGENTRUN_TENANT_QUOTAS), applied to each tenant never set through the
        API or the CLI; returns the tenants they were applied to."""
        if not quotas:
            return []
        seeds = [{k: (str(v) if isinstance(v, Decimal) else v) for k, v in _params(n, q).items()}
                 for n, q in quotas.items()]
        return [r["name"] for r in await self._all(SEED_QUOTAS, {"seeds": Jsonb(seeds)})]

    async def over_budget(self, tenants: list[str]) -> dict[str, Throttle]:
        """Of `tenants`, those at or over a daily budget now, with when the rolling window allows again."""
        rows = await self._all(
            """SELECT name, max_running, max_queued, tokens_per_day, cost_per_day_usd, weight FROM tenant
               WHERE name = ANY(%(names)s::text[]) AND (tokens_per_day IS NOT NULL OR cost_per_day_usd IS NOT NULL)""",
            {"names": tenants},
        )
        if not rows:
            return {}
        usage = {r["name"]: r for r in await self._all(BUDGETS, {"names": [r["name"] for r in rows], "all": False})}
        found = {}
        for row in rows:
            if (over := _budget(_quotas(row), usage.get(row["name"]))) is not None:
                found[row["name"]] = over
        return found

    async def throttle(
        self, run_id: uuid.UUID, worker: str, throttle: Throttle, *, epoch: int | None = None, again: bool = False,
    ) -> bool:
        """Hand a held run back until its tenant's budget allows again (`throttle.until`, capped at the run's
        deadline), showing why (`run.throttled`); False if this worker did not hold it under `epoch`."""
        row = await self._fenced(
            run_id, THROTTLE,
            {"id": run_id, "worker": worker, "epoch": epoch, "until": throttle.until,
             "throttled": Jsonb(throttle.json())},
            again=again,
        )
        return row is not None and row["id"] is not None


def _params(name: str, quotas: Quotas) -> dict[str, Any]:
    return {"name": name, "max_running": quotas.max_running, "max_queued": quotas.max_queued,
            "tokens_per_day": quotas.tokens_per_day, "cost_per_day_usd": quotas.cost_per_day_usd,
            "weight": quotas.weight}
