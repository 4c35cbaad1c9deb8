"""Done when (issue 27): a schedule of `intervalSeconds: 1` served by three `agentrun worker` processes creates
exactly one run per tick over 20 s of ticks, also with a worker killed with SIGKILL in between. Asserted on the
tick rows (unique, contiguous, each created one's run there once), not on timing: a loaded machine may make a
pass late, and then older ticks are `missed` rows, never a second run."""

from __future__ import annotations

import dataclasses
import datetime
import os
from pathlib import Path
from typing import Any

import psycopg

from agentrun.worker.core.schedules import Schedule, spec_json
from agentrun.worker.core.submission import RunSpec
from agentrun.worker.store import RunStore
from agentrun.worker.testing.fake_server import FakeAnthropic
from tests.support.ports import free_port
from tests.support.processes import start_worker, stop, wait_ready
from tests.support.waiting import eventually

REPO = Path(__file__).resolve().parents[2]


def _env(database_url: str, model_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update({"AGENTRUN_DATABASE_URL": database_url, "ANTHROPIC_BASE_URL": model_url, "ANTHROPIC_API_KEY": "test",
                "PYTHONPATH": str(REPO)})
    return env


async def _ticks(db: psycopg.AsyncConnection[Any]) -> list[tuple[datetime.datetime, str, Any]]:
    cur = await db.execute("SELECT scheduled_time, outcome, run_id FROM schedule_tick WHERE schedule_name = 'sec' "
                           "ORDER BY scheduled_time")
    return [(r[0], r[1], r[2]) for r in await cur.fetchall()]


async def test_three_worker_processes_one_run_per_tick_through_a_kill_9(
    store: RunStore, database_url: str, db: psycopg.AsyncConnection[Any]
) -> None:
    spec = RunSpec(input="tick", token_budget=1000, timeout_seconds=60)
    sched = Schedule(name="sec", cron=None, interval_seconds=1, timezone="UTC",
                     run={"input": "tick", "tokenBudget": 1000, "timeoutSeconds": 60}, spec=spec_json(spec))
    async with FakeAnthropic() as api:
        env = _env(database_url, api.base_url)
        args = ("--concurrency", "4", "--poll-interval", "0.2", "--no-migrate")
        ports = [free_port() for _ in range(3)]
        procs = [await start_worker(p, "--id", f"tick-{i}", *args, env=env) for i, p in enumerate(ports)]
        try:
            for p, proc in zip(ports, procs, strict=True):
                await wait_ready(f"http://127.0.0.1:{p}", proc)
            await store.create_schedule(sched)

            async def span(seconds: int) -> bool:
                ticks = await _ticks(db)
                return len(ticks) > 1 and (ticks[-1][0] - ticks[0][0]).total_seconds() >= seconds

            await eventually(lambda: span(8), 120, "8 s of ticks")
            procs[0].kill()  # SIGKILL: maybe mid-pass, holding the schedule's row
            await procs[0].wait()
            await eventually(lambda: span(20), 180, "20 s of ticks")
            await store.update_schedule(dataclasses.replace(sched, suspend=True))
        finally:
            for proc in procs:
                if proc.returncode is None:
                    await stop(proc)
    ticks = await _ticks(db)
    times = [t for t, _, _ in ticks]
    assert len(set(times)) == len(times)
    steps = {(b - a).total_seconds() for a, b in zip(times, times[1:], strict=False)}
    assert steps == {1.0}, f"ticks not contiguous: {sorted(steps)}"
    assert {o for _, o, _ in ticks} <= {"created", "missed"}
    created = {rid: t for t, o, rid in ticks if o == "created"}
    assert len(created) >= len(ticks) // 2, ticks  # most ticks ran; a late pass misses the older ones only
    cur = await db.execute("SELECT id, scheduled_time FROM run WHERE schedule_name = 'sec'")
    runs = await cur.fetchall()
    assert len(runs) == len(created), "a run per created tick, and none else"
    assert {r[0]: r[1] for r in runs} == created
