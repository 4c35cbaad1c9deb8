"""Retention: prune deletes old finished runs with their steps and lease history, in batches, and
nothing else; a dry run counts; a forked-from run is kept while its child is; workers prune periodically,
one at a time across the fleet, and count what they deleted."""

from __future__ import annotations

import asyncio
import datetime
import os
import subprocess
import sys
import uuid
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from agentrun.worker.core.records import RunStatus
from agentrun.worker.obs.metrics import Metrics
from agentrun.worker.store import RunStore, retention
from tests.support.builders import new_run
from tests.support.ports import free_port
from tests.support.processes import start_worker
from tests.support.waiting import eventually

DAY = datetime.timedelta(days=1)


async def _run(store: RunStore, db: psycopg.AsyncConnection[Any], status: str, age_days: float | None,
               steps: int = 3) -> uuid.UUID:
    """A run in `status`, finished `age_days` ago (None: unfinished), with `steps` steps and one lease row."""
    run, _ = await store.create(new_run(f"{status} {age_days}"))
    await db.execute(
        """UPDATE run SET status = %(s)s, claims = 1, locked_by = 'w',
               finished_at = CASE WHEN %(age)s::float8 IS NULL THEN NULL
                                  ELSE now() - make_interval(days => 0, secs => %(age)s * 86400) END
           WHERE id = %(id)s""",
        {"s": status, "age": age_days, "id": run.id},
    )
    for seq in range(1, steps + 1):
        await db.execute(
            "INSERT INTO run_step (run_id, seq, kind, status) VALUES (%s, %s, 'MODEL', 'DONE')", (run.id, seq)
        )
    return run.id


async def _ids(db: psycopg.AsyncConnection[Any]) -> set[uuid.UUID]:
    cur = await db.execute("SELECT id FROM run")
    return {r[0] for r in await cur.fetchall()}


async def _orphans(db: psycopg.AsyncConnection[Any]) -> int:
    cur = await db.execute(
        """SELECT (SELECT count(*) FROM run_step s WHERE NOT EXISTS (SELECT 1 FROM run r WHERE r.id = s.run_id))
                + (SELECT count(*) FROM run_lease l WHERE NOT EXISTS (SELECT 1 FROM run r WHERE r.id = l.run_id))""")
    return int((await cur.fetchone())[0])  # type: ignore[index]


async def test_prune_deletes_old_finished_runs_only(store: RunStore, db: psycopg.AsyncConnection[Any]) -> None:
    old = [await _run(store, db, s, 40) for s in ("SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT")]
    recent = await _run(store, db, "SUCCEEDED", 10)
    queued = await _run(store, db, "QUEUED", None)
    running = await _run(store, db, "RUNNING", None)
    waiting, _ = await store.create(new_run("scheduled far ahead", delay_seconds=90 * 86400))
    kept = {recent, queued, running, waiting.id}
    cur = await db.execute("SELECT count(*) FROM run_lease WHERE run_id = ANY(%s)", (old,))
    assert (await cur.fetchone())[0] == 4  # type: ignore[index]  # lease history exists for the old runs

    dry = await retention.prune(db, 30 * DAY, dry_run=True)
    assert dry.rows == {"run_step": 12, "run_lease": 4, "run_decision": 0, "run_message": 0, "run_webhook_attempt": 0, "run_webhook": 0,
                         "run": 4}
    assert await _ids(db) == {*old, *kept}  # a dry run deletes nothing

    done = await retention.prune(db, 30 * DAY, batch_size=3)
    assert done.rows == {"run_step": 12, "run_lease": 4, "run_decision": 0, "run_message": 0, "run_webhook_attempt": 0, "run_webhook": 0,
                         "run": 4}
    assert await _ids(db) == kept
    assert await _orphans(db) == 0
    assert (await retention.prune(db, 30 * DAY)).runs == 0
    assert "deleted 0 run_step, 0 run_lease, 0 run_decision, 0 run_message, 0 run_webhook_attempt, 0 run_webhook, 0 run" == (await retention.prune(db, 30 * DAY)).describe()


async def test_prune_batches_report_each_batch(store: RunStore, db: psycopg.AsyncConnection[Any]) -> None:
    for _ in range(7):
        await _run(store, db, "SUCCEEDED", 40, steps=1)
    batches: list[int] = []
    total = await retention.prune(db, 30 * DAY, batch_size=3, on_batch=lambda p: batches.append(p.runs))
    assert batches == [3, 3, 1, 0] and total.runs == 7


async def test_a_forked_from_run_is_kept_while_its_child_is(store: RunStore, db: psycopg.AsyncConnection[Any]) -> None:
    """With the migrated parent link on run (parent_run_id, 0008), a parent goes only after its children."""
    parent = await _run(store, db, "SUCCEEDED", 50)
    child = await _run(store, db, "SUCCEEDED", 5)  # recent: kept, and so is its parent
    await db.execute("UPDATE run SET parent_run_id = %s WHERE id = %s", (parent, child))
    lone = await _run(store, db, "FAILED", 50)
    assert (await retention.prune(db, 30 * DAY, dry_run=True)).runs == 1
    assert (await retention.prune(db, 30 * DAY)).runs == 1
    assert await _ids(db) == {parent, child}
    # Once the child is old enough too, both go: the child first, its parent in the next batch.
    assert (await retention.prune(db, DAY, dry_run=True)).runs == 2
    assert (await retention.prune(db, DAY)).runs == 2
    assert await _ids(db) == set()
    assert lone not in await _ids(db)


async def test_one_pruner_at_a_time(store: RunStore, db: psycopg.AsyncConnection[Any], pool: AsyncConnectionPool[Any]) -> None:
    await _run(store, db, "SUCCEEDED", 40)
    await db.execute("SELECT pg_advisory_lock(%s)", (retention.PRUNE_LOCK_KEY,))  # another worker is pruning
    assert await retention.prune_if_first(pool, 30 * DAY) is None
    await db.execute("SELECT pg_advisory_unlock(%s)", (retention.PRUNE_LOCK_KEY,))
    pruned = await retention.prune_if_first(pool, 30 * DAY)
    assert pruned is not None and pruned.runs == 1


async def test_periodic_pruning_counts_rows_in_metrics(store: RunStore, db: psycopg.AsyncConnection[Any], pool: AsyncConnectionPool[Any]) -> None:
    await _run(store, db, "SUCCEEDED", 40, steps=2)
    metrics = Metrics()
    stopping = asyncio.Event()
    task = asyncio.create_task(retention.prune_periodically(pool, 30, 0.1, stopping, on_batch=metrics.pruned))
    try:
        async def gone() -> bool:
            return not await _ids(db)

        await eventually(gone, timeout=20, what="the periodic prune")
        await _run(store, db, "FAILED", 31, steps=1)  # the next pass takes this one
        await eventually(gone, timeout=20, what="the second pass")
    finally:
        stopping.set()
        await asyncio.wait_for(task, 20)
    text = (await metrics.exposition()).decode()
    assert 'agentrun_pruned_rows_total{table="run"} 2.0' in text
    assert 'agentrun_pruned_rows_total{table="run_step"} 3.0' in text


async def test_cli_prune(store: RunStore, db: psycopg.AsyncConnection[Any], database_url: str) -> None:
    await _run(store, db, "SUCCEEDED", 40)
    await _run(store, db, "SUCCEEDED", 1)
    env = {**os.environ, "AGENTRUN_DATABASE_URL": database_url}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "agentrun.worker.cli", "prune", *args],
                              capture_output=True, text=True, env=env, timeout=120)

    out = await asyncio.to_thread(cli, "--older-than", "30d", "--dry-run")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "would delete 3 run_step, 1 run_lease, 0 run_decision, 0 run_message, 0 run_webhook_attempt, 0 run_webhook, 1 run"
    out = await asyncio.to_thread(cli, "--older-than", "30d", "--batch-size", "1")
    assert out.returncode == 0 and out.stdout.strip() == "deleted 3 run_step, 1 run_lease, 0 run_decision, 0 run_message, 0 run_webhook_attempt, 0 run_webhook, 1 run", out.stderr
    assert len(await _ids(db)) == 1
    bad = await asyncio.to_thread(cli, "--older-than", "soon")
    assert bad.returncode == 2 and "not a duration" in bad.stderr
    bad = await asyncio.to_thread(cli, "--older-than", "30d", "--batch-size", "0")
    assert bad.returncode == 2
    assert (await store.get(next(iter(await _ids(db))))).status is RunStatus.SUCCEEDED  # type: ignore[union-attr]


async def test_worker_process_prunes_with_retention_days(store: RunStore, db: psycopg.AsyncConnection[Any],
                                                         database_url: str, tmp_path: Any) -> None:
    """`agentrun worker --retention-days 30` prunes by itself and counts the rows on /metrics."""
    import httpx

    old = await _run(store, db, "SUCCEEDED", 40, steps=2)
    kept = await _run(store, db, "SUCCEEDED", 1, steps=2)
    port = free_port()
    env = {**os.environ, "AGENTRUN_DATABASE_URL": database_url, "ANTHROPIC_BASE_URL": "http://127.0.0.1:9",
           "AGENTRUN_RETENTION_INTERVAL_SECONDS": "0.2"}
    log = (tmp_path / "worker.log").open("w")
    proc = await start_worker(port, "--id", "pruner", "--concurrency", "1", "--retention-days", "30", "--no-migrate",
                              env=env, stdout=log, stderr=log)
    try:
        async def pruned() -> bool:
            if proc.returncode is not None:
                raise AssertionError((tmp_path / "worker.log").read_text()[-2000:])
            return old not in await _ids(db)

        await eventually(pruned, timeout=60, what="the worker to prune")
        assert kept in await _ids(db)

        async def counted() -> bool:
            try:
                async with httpx.AsyncClient() as c:
                    text = (await c.get(f"http://127.0.0.1:{port}/metrics")).text
            except httpx.TransportError:
                return False
            return 'agentrun_pruned_rows_total{table="run_step"} 2.0' in text

        await eventually(counted, timeout=30, what="the pruned rows on /metrics")
    finally:
        if proc.returncode is None:
            proc.terminate()
        assert await asyncio.wait_for(proc.wait(), 30) == 0


async def test_decisions_are_pruned_with_their_runs(store: RunStore, db: psycopg.AsyncConnection[Any]) -> None:
    """The migrated run_decision table (0008, not a stand-in made here) goes with its run."""
    old = await _run(store, db, "SUCCEEDED", 40, steps=1)
    waiting = await _run(store, db, "RUNNING", None, steps=1)
    for run_id in (old, waiting):
        await db.execute("INSERT INTO run_decision (run_id, tool_use_id, kind, tool_name) VALUES (%s, 'toolu_1', 'approval', 't')", (run_id,))
    assert (await retention.prune(db, 30 * DAY, dry_run=True)).rows["run_decision"] == 1
    assert (await retention.prune(db, 30 * DAY)).rows == {"run_step": 1, "run_lease": 1, "run_decision": 1, "run_message": 0,
                                                         "run_webhook_attempt": 0, "run_webhook": 0, "run": 1}
    cur = await db.execute("SELECT run_id FROM run_decision")
    assert [r[0] for r in await cur.fetchall()] == [waiting]


async def test_a_finished_sub_agent_is_kept_while_its_parent_is_active(
    store: RunStore, db: psycopg.AsyncConnection[Any],
) -> None:
    """A parent that waits for its sub-agents reads each child's row for the call's result: a child pruned
    first (finished long ago, its parent still at work) would make the parent start a second child for the
    same call, and pay for its model calls and its tools' side effects twice. So a child goes only once
    its parent has finished, and the dry run counts it the same way."""
    parent = await _run(store, db, "QUEUED", None)  # woken by its child's end, not yet claimed
    child = await _run(store, db, "SUCCEEDED", 40)
    await db.execute("UPDATE run SET parent_run_id = %s, parent_tool_use_id = 'toolu_a', root_run_id = %s, depth = 1 "
                     "WHERE id = %s", (parent, parent, child))
    grandchild = await _run(store, db, "SUCCEEDED", 40)
    await db.execute("UPDATE run SET parent_run_id = %s, parent_tool_use_id = 'toolu_b', root_run_id = %s, depth = 2 "
                     "WHERE id = %s", (child, parent, grandchild))
    forked = await _run(store, db, "SUCCEEDED", 40)  # a fork or a continuation copied its steps: no need to wait
    other = await _run(store, db, "RUNNING", None)
    await db.execute("UPDATE run SET parent_run_id = %s WHERE id = %s", (other, forked))
    # The grandchild's parent has finished: it may go; the child, whose parent is active, may not.
    assert (await retention.prune(db, 30 * DAY, dry_run=True)).runs == 2
    assert (await retention.prune(db, 30 * DAY)).runs == 2
    assert await _ids(db) == {parent, child, other}
    # The parent ends: then it goes, and its child before it.
    await db.execute("UPDATE run SET status = 'SUCCEEDED', finished_at = now() - interval '40 days' WHERE id = %s",
                     (parent,))
    assert (await retention.prune(db, 30 * DAY, dry_run=True)).runs == 2
    assert (await retention.prune(db, 30 * DAY)).runs == 2
    assert await _ids(db) == {other}
