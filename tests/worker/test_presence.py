"""Wake-ups and liveness: a notification wakes an idle worker, and a dead worker's run is claimable at once."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from agentrun.worker.cli import build_parser
from agentrun.worker.core.records import RunStatus
from agentrun.worker.runtime.presence import DuplicateWorker, Presence
from agentrun.worker.store import LIVENESS_LOCK_CLASS, Claim, RunStore
from agentrun.worker.testing.scripted import TurnBasedLlm
from agentrun.worker.tools import ToolContext, tool
from tests.support.builders import new_run, worker
from tests.support.waiting import eventually


@tool(name="noop")
async def noop(args: dict[str, Any], ctx: ToolContext) -> str:
    return "ok"


class CountingStore(RunStore):
    """Counts claim attempts, so a test knows the worker has looked once and gone idle."""

    claims = 0

    async def claim_many(self, worker: str, lease_seconds: float, liveness: bool = False, **kw: Any) -> list[Claim]:
        found = await super().claim_many(worker, lease_seconds, liveness, **kw)
        self.claims += 1
        return found


async def _idle_worker(store: CountingStore, name: str) -> tuple[Any, asyncio.Task[None]]:
    """A worker that polls once a minute, started and past its first (empty) claim."""
    w = worker(store, TurnBasedLlm(1), [noop], name, poll=60.0)
    serving = asyncio.create_task(w.run())

    async def idle() -> bool:
        return store.claims >= 1

    await eventually(idle, what="the first claim")
    return w, serving


async def _status(store: RunStore, run_id: Any) -> RunStatus | None:
    run = await store.get(run_id)
    return run.status if run else None


async def test_a_queued_run_wakes_an_idle_worker(store: RunStore) -> None:
    counting = CountingStore(store.pool)
    w, serving = await _idle_worker(counting, "worker-A")
    try:
        run, _ = await counting.create(new_run())

        async def succeeded() -> bool:
            return await _status(counting, run.id) is RunStatus.SUCCEEDED

        # Far sooner than the 60 s poll: only the notification can have woken it.
        await eventually(succeeded, timeout=20, what="the idle worker to run the new run")
    finally:
        w.stop()
        await serving


async def test_the_listener_reconnects_after_its_connection_drops(
    store: RunStore, db: psycopg.AsyncConnection[Any]
) -> None:
    counting = CountingStore(store.pool)
    w, serving = await _idle_worker(counting, "worker-A")
    try:
        conn = w.presence._conn
        assert conn is not None
        first = conn.info.backend_pid
        await db.execute("SELECT pg_terminate_backend(%s)", (first,))

        async def back() -> bool:
            again = w.presence._conn
            return w.presence.ready.is_set() and again is not None and again.info.backend_pid != first

        await eventually(back, what="the presence connection to come back")
        run, _ = await counting.create(new_run())

        async def succeeded() -> bool:
            return await _status(counting, run.id) is RunStatus.SUCCEEDED

        await eventually(succeeded, timeout=20, what="the re-listening worker to run the new run")
    finally:
        w.stop()
        await serving


async def test_a_released_lease_wakes_an_idle_worker(store: RunStore) -> None:
    run, _ = await store.create(new_run())
    assert await store.claim("worker-gone", 30)  # held under a live lease by a worker without a lock
    counting = CountingStore(store.pool)
    # Without the liveness lock, or it would take the lockless holder's run as a dead worker's at once.
    w = worker(counting, TurnBasedLlm(1), [noop], "worker-A", poll=60.0, liveness_lock=False)
    serving = asyncio.create_task(w.run())
    try:
        async def looked() -> bool:
            return counting.claims >= 1

        await eventually(looked, what="the first claim")
        assert await _status(store, run.id) is RunStatus.RUNNING
        assert await store.release(run.id, "worker-gone")

        async def succeeded() -> bool:
            return await _status(store, run.id) is RunStatus.SUCCEEDED

        await eventually(succeeded, timeout=20, what="the idle worker to take the released run")
    finally:
        w.stop()
        await serving


async def _hold_lock(database_url: str, worker_id: str) -> psycopg.AsyncConnection[Any]:
    """A session standing in for a live worker: it holds that worker's liveness lock."""
    conn = await psycopg.AsyncConnection.connect(database_url, autocommit=True)
    await conn.execute("SELECT pg_advisory_lock(%s, hashtext(%s))", (LIVENESS_LOCK_CLASS, worker_id))
    return conn


async def test_a_dead_workers_run_is_claimable_at_once(store: RunStore, database_url: str) -> None:
    run, _ = await store.create(new_run())
    alive = await _hold_lock(database_url, "worker-A")
    try:
        assert await store.claim("worker-A", 30, liveness=True)
        # A lives (its lock is held) and its lease runs: nobody may take the run.
        assert await store.claim("worker-B", 30, liveness=True) is None
    finally:
        await alive.close()  # worker A dies: PostgreSQL ends its session and frees the lock

    async def taken() -> bool:
        await store.suspect("worker-B", 0.5)  # what an idle worker does after a claim that found nothing
        return await store.claim("worker-B", 30, liveness=True, liveness_grace=0.5) is not None

    await eventually(taken, what="worker B to take over the dead worker's run")
    after = await store.get(run.id)
    assert after is not None and after.locked_by == "worker-B" and after.status is RunStatus.RUNNING
    assert after.locked_until is not None  # taken over long before A's 30 s lease would have lapsed


async def test_without_liveness_a_dead_workers_run_waits_for_its_lease(store: RunStore) -> None:
    await store.create(new_run())
    assert await store.claim("worker-A", 30)  # worker A holds no lock at all: it looks dead
    assert await store.claim("worker-B", 30, liveness=False) is None
    assert await store.suspect("worker-B", 0.0) == 0.0  # A's lock is free: suspected, with no grace to wait
    assert await store.claim("worker-B", 30, liveness=False, liveness_grace=0.0) is None
    assert await store.claim("worker-B", 30, liveness=True, liveness_grace=0.0) is not None


async def test_a_running_worker_holds_its_lock_and_a_stopped_one_lets_go(
    store: RunStore, database_url: str, db: psycopg.AsyncConnection[Any]
) -> None:
    async def held(worker_id: str) -> bool:
        cur = await db.execute(
            """SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted
                 AND classid = %s AND objid = hashtext(%s)::oid AND objsubid = 2""",
            (LIVENESS_LOCK_CLASS, worker_id),
        )
        return bool((await cur.fetchone())[0])  # type: ignore[index]

    counting = CountingStore(store.pool)
    w, serving = await _idle_worker(counting, "worker-A")
    assert await held("worker-A")
    with pytest.raises(DuplicateWorker, match="worker-A"):
        await Presence(store, "worker-A", asyncio.Event()).start(timeout=0.5)
    w.stop()
    await serving

    async def let_go() -> bool:  # the server ends the closed session (and frees its lock) a moment later
        return not await held("worker-A")

    await eventually(let_go, 30, "the stopped worker's session to let go of its lock")

    off = worker(store, TurnBasedLlm(1), [noop], "worker-C", poll=60.0, liveness_lock=False)
    await off.presence.start()
    try:
        assert off.presence.ready.is_set() and not await held("worker-C")
    finally:
        await off.presence.close()


def test_the_cli_turns_the_liveness_lock_off() -> None:
    assert build_parser().parse_args(["worker"]).no_liveness_lock is False
    assert build_parser().parse_args(["worker", "--no-liveness-lock"]).no_liveness_lock is True


async def test_a_wake_up_during_a_claim_is_not_lost(store: RunStore) -> None:
    """stop() (or a notification) arriving while a claim is in flight ends the idle wait at once."""
    entered, proceed = asyncio.Event(), asyncio.Event()

    class SlowClaim(RunStore):
        async def claim_many(
            self, worker: str, lease_seconds: float, liveness: bool = False, **kw: Any
        ) -> list[Claim]:
            entered.set()
            await proceed.wait()
            return await super().claim_many(worker, lease_seconds, liveness, **kw)

    w = worker(SlowClaim(store.pool), TurnBasedLlm(1), [noop], "worker-A", poll=60.0)
    serving = asyncio.create_task(w.run())
    await asyncio.wait_for(entered.wait(), 10)
    w.stop()
    proceed.set()
    await asyncio.wait_for(serving, 10)  # not the 60 s poll
