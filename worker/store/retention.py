"""Retention: delete finished runs older than a cutoff, with their steps, lease history and decisions,
a small batch per statement, so pruning never holds a long lock or a long transaction."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import AsyncConnectionPool

from agentrun.worker.store.channels import PRUNE_LOCK_KEY

log = logging.getLogger("agentrun.worker.store.retention")

# Tables whose rows belong to one run (a `run_id` column), deleted with it. Only those that exist are
# used, so a table an issue adds later (run_decision) is one line here and nothing else.
# The webhook attempts come before their deliveries (their foreign key).
CHILD_TABLES: tuple[str, ...] = ("run_step", "run_lease", "run_decision", "run_message", "run_webhook_attempt",
                                 "run_webhook")
# A column of `run` naming the run it was continued or forked from. A run another run points at is kept
# as long as that one is (the link stays true); once both are old enough the child goes first, then it.
PARENT_COLUMNS: tuple[str, ...] = ("parent_run_id",)

FINISHED = ("SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT")

# Old enough to go by itself: finished before the cutoff, and not a sub-agent whose parent is still at work.
# Such a parent reads its children's rows for the calls' results (once each is recorded, its steps hold
# it): a child pruned first would be made again for the same call, its model calls and its tools' side
# effects paid twice. Once its parent has finished, a child goes as any run does.
OLD_ENOUGH = """r.status = ANY(%(finished)s) AND r.finished_at < %(cutoff)s
    AND NOT (r.parent_tool_use_id IS NOT NULL AND EXISTS (
        SELECT 1 FROM run p WHERE p.id = r.parent_run_id AND NOT (p.status = ANY(%(finished)s))))"""
DEFAULT_BATCH = 100
REST = 2.0
"""After each batch the prune rests twice as long as the batch took: it takes at most a third of one
database core, whatever the machine, so the workers' claims and checkpoints keep theirs (bench B7)."""


@dataclasses.dataclass(frozen=True)
class Pruned:
    """Rows deleted (or, in a dry run, that would be), by table."""

    rows: Mapping[str, int]

    @property
    def runs(self) -> int:
        return self.rows.get("run", 0)

    def describe(self, dry_run: bool = False) -> str:
        verb = "would delete" if dry_run else "deleted"
        parts = ", ".join(f"{n} {table}" for table, n in self.rows.items())
        return f"{verb} {parts}"


async def _existing(conn: psycopg.AsyncConnection[Any]) -> tuple[list[str], list[str]]:
    cur = await conn.execute(
        "SELECT t FROM unnest(%s::text[]) AS t WHERE to_regclass(t) IS NOT NULL", (list(CHILD_TABLES),)
    )
    tables = [r[0] for r in await cur.fetchall()]
    cur = await conn.execute(
        """SELECT column_name FROM information_schema.columns
           WHERE table_schema = current_schema() AND table_name = 'run' AND column_name = ANY(%s)""",
        (list(PARENT_COLUMNS),),
    )
    parents = [r[0] for r in await cur.fetchall()]
    return tables, parents


def _eligible(parents: list[str]) -> sql.Composed:
    """Old enough, and no run (kept or not yet pruned) points at it as its parent."""
    no_child = sql.SQL("").join(
        sql.SQL(" AND NOT EXISTS (SELECT 1 FROM run c WHERE c.{} = r.id)").format(sql.Identifier(p))
        for p in parents
    )
    return sql.SQL(OLD_ENOUGH + "{}").format(no_child)


async def prune_batch(
    conn: psycopg.AsyncConnection[Any], cutoff: datetime.datetime, batch_size: int,
    tables: list[str], parents: list[str],
) -> Pruned:
    """Delete up to `batch_size` prunable runs and their rows in ONE statement (one short transaction).

    Rows another transaction has locked (a cancel racing the prune) are skipped, not waited for.
    """
    deletes = sql.SQL(", ").join(
        sql.SQL("{} AS (DELETE FROM {} WHERE run_id IN (SELECT id FROM doomed) RETURNING 1)").format(
            sql.Identifier(f"d_{t}"), sql.Identifier(t))
        for t in tables
    )
    counts = sql.SQL(", ").join(
        sql.SQL("(SELECT count(*) FROM {}) AS {}").format(sql.Identifier(f"d_{t}"), sql.Identifier(t))
        for t in tables
    )
    query = sql.SQL(
        """WITH doomed AS (
               SELECT r.id FROM run r WHERE {eligible}
               ORDER BY r.finished_at LIMIT %(batch)s FOR UPDATE SKIP LOCKED),
           {deletes},
           d_run AS (DELETE FROM run WHERE id IN (SELECT id FROM doomed) RETURNING 1)
           SELECT {counts}, (SELECT count(*) FROM d_run) AS run"""
    ).format(eligible=_eligible(parents), deletes=deletes, counts=counts)
    cur = await conn.execute(query, {"finished": list(FINISHED), "cutoff": cutoff, "batch": batch_size})
    row = await cur.fetchone()
    assert row is not None and cur.description is not None
    return Pruned({d.name: int(v) for d, v in zip(cur.description, row, strict=True)})


async def count_prunable(
    conn: psycopg.AsyncConnection[Any], cutoff: datetime.datetime, tables: list[str], parents: list[str],
) -> Pruned:
    """What pruning to `cutoff` would delete, all batches together: eligible runs but the ancestors of a
    kept run (a child that is kept keeps its whole chain)."""
    doomed: sql.Composable
    if parents:
        links = sql.SQL(" UNION ").join(
            sql.SQL("SELECT r.{p} FROM run r JOIN kept k ON r.id = k.id WHERE r.{p} IS NOT NULL").format(
                p=sql.Identifier(p))
            for p in parents
        )
        doomed = sql.SQL(
            """WITH RECURSIVE kept(id) AS (
                   SELECT r.id FROM run r
                   WHERE NOT ({old_enough}) AND ({any_parent})
                   UNION {links}),
               doomed AS (SELECT r.id FROM run r WHERE {old_enough}
                          AND r.id NOT IN (SELECT id FROM kept WHERE id IS NOT NULL))"""
        ).format(
            old_enough=sql.SQL(OLD_ENOUGH),
            any_parent=sql.SQL(" OR ").join(sql.SQL("r.{} IS NOT NULL").format(sql.Identifier(p)) for p in parents),
            links=links,
        )
    else:
        doomed = sql.SQL("WITH doomed AS (SELECT r.id FROM run r WHERE {})").format(sql.SQL(OLD_ENOUGH))
    counts = sql.SQL(", ").join(
        sql.SQL("(SELECT count(*) FROM {} WHERE run_id IN (SELECT id FROM doomed)) AS {}").format(
            sql.Identifier(t), sql.Identifier(t))
        for t in tables
    )
    query = sql.SQL("{doomed} SELECT {counts}, (SELECT count(*) FROM doomed) AS run").format(
        doomed=doomed, counts=counts)
    cur = await conn.execute(query, {"finished": list(FINISHED), "cutoff": cutoff})
    row = await cur.fetchone()
    assert row is not None and cur.description is not None
    return Pruned({d.name: int(v) for d, v in zip(cur.description, row, strict=True)})


async def prune(
    conn: psycopg.AsyncConnection[Any],
    older_than: datetime.timedelta,
    *,
    batch_size: int = DEFAULT_BATCH,
    dry_run: bool = False,
    rest: float = REST,
    on_batch: Callable[[Pruned], None] | None = None,
    stopping: asyncio.Event | None = None,
) -> Pruned:
    """Prune finished runs that finished more than `older_than` ago (by the database's clock), batch by
    batch until none is left; returns the totals. `conn` must be in autocommit mode, so each batch is
    its own transaction. After each batch it rests `rest` times as long as the batch took, leaving the
    database to the workers: the busier the database, the slower the prune."""
    if batch_size < 1:
        raise ValueError(f"batch size must be at least 1, got {batch_size}")
    cur = await conn.execute("SELECT now() - %s::interval", (older_than,))
    row = await cur.fetchone()
    assert row is not None
    cutoff: datetime.datetime = row[0]
    tables, parents = await _existing(conn)
    if dry_run:
        return await count_prunable(conn, cutoff, tables, parents)
    total: dict[str, int] = {t: 0 for t in [*tables, "run"]}
    while stopping is None or not stopping.is_set():
        t0 = time.monotonic()
        pruned = await prune_batch(conn, cutoff, batch_size, tables, parents)
        took = time.monotonic() - t0
        for table, n in pruned.rows.items():
            total[table] = total.get(table, 0) + n
        if on_batch is not None:
            on_batch(pruned)
        if pruned.runs == 0:
            break
        if rest > 0:
            await asyncio.sleep(took * rest)
    return Pruned(total)


EVENTS_BATCH = 1000
"""Expired events one statement deletes (POST /api/events' table, run_event: rows of no run)."""


async def prune_events(
    conn: psycopg.AsyncConnection[Any], retention: float, *, batch_size: int = EVENTS_BATCH,
    stopping: asyncio.Event | None = None,
) -> int:
    """Delete the events kept longer than `retention` seconds (AGENTRUN_EVENT_RETENTION), a batch per
    statement: no wait that begins now may get them any more. `conn` in autocommit. Returns how many."""
    total = 0
    while stopping is None or not stopping.is_set():
        cur = await conn.execute(
            """WITH gone AS (DELETE FROM run_event WHERE id IN (
                   SELECT id FROM run_event WHERE created_at < now() - make_interval(secs => %s::float8)
                   ORDER BY created_at LIMIT %s) RETURNING 1)
               SELECT count(*) FROM gone""",
            (retention, batch_size),
        )
        row = await cur.fetchone()
        n = int(row[0]) if row else 0
        total += n
        if n < batch_size:
            break
    return total


# What each tenant's model steps spent, by minute (store/steps.py): the daily budgets sum the last 1,440
# minutes (store/tenants.py), so older minutes count for nothing and go. A few rows per tenant, minute and
# worker session: one statement.
PRUNE_USAGE = """WITH gone AS (
    DELETE FROM tenant_usage WHERE minute <= date_trunc('minute', now()) - interval '1 day' RETURNING 1)
SELECT count(*) FROM gone"""


async def prune_if_first(
    pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]],
    older_than: datetime.timedelta | None,
    *,
    batch_size: int = DEFAULT_BATCH,
    rest: float = REST,
    on_batch: Callable[[Pruned], None] | None = None,
    stopping: asyncio.Event | None = None,
    event_retention: float | None = None,
) -> Pruned | None:
    """Prune unless another process of the fleet is pruning now (its advisory lock is taken): None then.
    Runs finished more than `older_than` ago (None: no run), events kept past `event_retention` seconds
    (None: none), counted as `run_event`, and tenants' usage older than a day (`tenant_usage`).

    The lock is a session lock on the connection that prunes, so a worker that dies mid-prune frees it.
    """
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT pg_try_advisory_lock(%s)", (PRUNE_LOCK_KEY,))
        row = await cur.fetchone()
        if not row or not row[0]:
            return None
        try:
            pruned = Pruned({})
            if older_than is not None:
                pruned = await prune(conn, older_than, batch_size=batch_size, rest=rest, on_batch=on_batch,
                                     stopping=stopping)
            if event_retention is not None:
                events = await prune_events(conn, event_retention, stopping=stopping)
                if events:
                    pruned = Pruned({**pruned.rows, "run_event": events})
            cur = await conn.execute(PRUNE_USAGE.encode())
            if (gone := await cur.fetchone()) is not None and gone[0]:
                pruned = Pruned({**pruned.rows, "tenant_usage": int(gone[0])})
            return pruned
        finally:
            await conn.execute("SELECT pg_advisory_unlock(%s)", (PRUNE_LOCK_KEY,))


async def prune_periodically(
    pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]],
    days: float | None,
    interval: float,
    stopping: asyncio.Event,
    on_batch: Callable[[Pruned], None] | None = None,
    batch_size: int = DEFAULT_BATCH,
    rest: float = REST,
    event_retention: float | None = None,
) -> None:
    """A worker's retention task: every `interval` seconds (the first soon after start), prune runs
    finished more than `days` ago (None: keep them) and events past `event_retention` seconds, if no other
    worker is at it. Errors are logged and retried next time."""
    older_than = datetime.timedelta(days=days) if days is not None else None
    while not stopping.is_set():
        try:
            pruned = await prune_if_first(pool, older_than, batch_size=batch_size, rest=rest,
                                          on_batch=on_batch, stopping=stopping, event_retention=event_retention)
            if pruned is not None and pruned.runs:
                log.info("retention: %s (finished over %g days ago)", pruned.describe(), days)
            elif pruned is not None and pruned.rows.get("run_event"):
                log.info("retention: deleted %d events kept past their window", pruned.rows["run_event"])
        except Exception as e:
            log.warning("retention: pruning failed, trying again in %.0fs: %s", interval, e)
        try:
            async with asyncio.timeout(interval):
                await stopping.wait()
        except TimeoutError:
            pass
