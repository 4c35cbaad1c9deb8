"""The worker loop: graceful stop hands runs back at once; the CLI starts and serves health."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from typing import Any

import psycopg

from agentrun.worker.core.records import RunStatus
from agentrun.worker.store import RunStore
from agentrun.worker.testing.scripted import ScriptedLlm
from agentrun.worker.tools import ToolContext, tool
from tests.support.builders import new_run, worker
from tests.support.ports import free_port
from tests.support.processes import wait_ready, worker_argv
from tests.support.running import finished, running
from tests.support.waiting import eventually


async def test_stop_lets_the_step_finish_and_releases_the_lease(store: RunStore, db: psycopg.AsyncConnection[Any]) -> None:
    run, _ = await store.create(new_run())
    entered, proceed = asyncio.Event(), asyncio.Event()

    @tool(name="step")
    async def step(args: dict[str, Any], ctx: ToolContext) -> str:
        entered.set()
        await proceed.wait()
        return "finished during shutdown"

    llm = ScriptedLlm().then_tool_use("t1", "step").then_text("done")
    a = worker(store, llm, [step], "worker-A")
    serving = asyncio.create_task(a.run())
    await asyncio.wait_for(entered.wait(), 10)
    a.stop()  # SIGTERM
    proceed.set()
    await asyncio.wait_for(serving, 10)

    after = await store.get(run.id)
    # Handed back: queued again with no holder, claimable at once, no lease to wait out.
    assert after is not None and after.status is RunStatus.QUEUED and after.locked_by is None
    cur = await db.execute("SELECT run_at <= now() FROM run WHERE id = %s", (run.id,))
    assert (await cur.fetchone())[0]  # type: ignore[index]
    steps = await store.timeline(run.id)
    assert steps[-1].status.value == "DONE"  # the in-flight step was allowed to finish

    assert await worker(store, llm, [step], "worker-B").run_once() == run.id
    assert (await store.get(run.id)).status is RunStatus.SUCCEEDED  # type: ignore[union-attr]
    assert len(llm.seen) == 2


def test_cli_migrate_and_worker_serve_health(database_url: str) -> None:
    env = {**os.environ, "AGENTRUN_DATABASE_URL": database_url, "ANTHROPIC_BASE_URL": "http://127.0.0.1:9"}
    out = subprocess.run([sys.executable, "-m", "agentrun.worker.cli", "migrate"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "up to date" in out.stdout

    port = free_port()
    proc = subprocess.Popen(
        worker_argv(port, "--id", "cli-worker", "--concurrency", "0"),
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        asyncio.run(wait_ready(f"http://127.0.0.1:{port}", proc, timeout=30))
        assert proc.poll() is None
        proc.terminate()
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        output = proc.stdout.read() if proc.stdout else ""
    assert "cli-worker serving on" in output and "cli-worker stopped" in output


def test_cli_without_database_says_what_to_set() -> None:
    env = {k: v for k, v in os.environ.items() if k != "AGENTRUN_DATABASE_URL"}
    out = subprocess.run([sys.executable, "-m", "agentrun.worker.cli", "migrate"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "AGENTRUN_DATABASE_URL" in out.stderr and "Traceback" not in out.stderr


async def test_reclaiming_its_own_lapsed_run_supersedes_the_old_driver(
    store: RunStore, db: psycopg.AsyncConnection[Any]
) -> None:
    """A lease that lapsed under a live driver (say the database was away) and is claimed again by the
    same worker: the old driver is stopped first, and the new claim's lease is not given away."""
    run, _ = await store.create(new_run())
    first_started, first_cancelled = asyncio.Event(), asyncio.Event()
    lease_alive_on_retry: list[bool] = []

    @tool(name="slow")
    async def slow(args: dict[str, Any], ctx: ToolContext) -> str:
        if not first_started.is_set():
            first_started.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                first_cancelled.set()
                raise
        cur = await db.execute("SELECT locked_until > now() FROM run WHERE id = %s", (ctx.run_id,))
        lease_alive_on_retry.append(bool((await cur.fetchone())[0]))  # type: ignore[index]
        return "second time lucky"

    class RecordingStore(RunStore):
        released: list[uuid.UUID] = []

        async def release(self, run_id: uuid.UUID, worker: str, **kw: Any) -> bool:
            self.released.append(run_id)
            return await super().release(run_id, worker, **kw)

    llm = ScriptedLlm().then_tool_use("t1", "slow").then_text("done")
    recording = RecordingStore(store.pool)
    a = worker(recording, llm, [slow], "worker-A")
    serving = asyncio.create_task(a.run())
    try:
        await asyncio.wait_for(first_started.wait(), 10)
        await db.execute("UPDATE run SET locked_until = now() - interval '1 second' WHERE id = %s", (run.id,))

        async def succeeded() -> bool:
            after = await store.get(run.id)
            return after is not None and after.status is RunStatus.SUCCEEDED

        await eventually(succeeded, what="the run to finish under its second claim")
    finally:
        a.stop()
        await asyncio.wait_for(serving, 10)
    assert first_cancelled.is_set() and lease_alive_on_retry == [True]
    assert recording.released == []  # the superseded driver did not hand back the new claim's lease
    steps = await store.timeline(run.id)
    assert steps[1].attempts == 2 and len(llm.seen) == 2


async def test_a_runs_successor_is_claimed_while_its_last_write_commits(store: RunStore) -> None:
    """At concurrency 1 the second run starts while the first one's end is still on its way (Worker._free):
    the slot does not stand empty for a claim after every run."""
    release = asyncio.Event()
    held: list[uuid.UUID] = []

    class SlowEnds(RunStore):
        async def finish(self, run_id: uuid.UUID, *a: Any, **kw: Any) -> Any:
            if not held:
                held.append(run_id)
                await release.wait()
            return await super().finish(run_id, *a, **kw)

    first, _ = await store.create(new_run("first"))
    second, _ = await store.create(new_run("second"))
    llm = ScriptedLlm().then_text("one").then_text("two")
    w = worker(SlowEnds(store.pool), llm, concurrency=1)
    async with running(w):
        ended = await finished(store, second.id)  # while the first one's end is held
        before = await store.get(first.id)
        assert held == [first.id] and before is not None and before.status is RunStatus.RUNNING
        assert ended.status is RunStatus.SUCCEEDED and w.leaving == {first.id}
        release.set()
        after = await finished(store, first.id)
    assert after.status is RunStatus.SUCCEEDED
    assert not w.leaving and not w.driving
