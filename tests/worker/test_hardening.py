"""The engine under connection blips, lost write outcomes, cancels mid-step, and runs that kill workers.

Real PostgreSQL and the real worker loop; connections are cut with pg_terminate_backend, as a pooler
restart, a failover or an idle-connection timeout would cut them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
import uuid
from typing import Any

import psycopg
import pytest

from agentrun.worker import cli
from agentrun.worker.core.records import RunStatus, StepStatus
from agentrun.worker.core.types import LlmRequest, LlmResponse
from agentrun.worker.store import LIVENESS_LOCK_CLASS, RunStore
from agentrun.worker.testing.scripted import ScriptedLlm
from agentrun.worker.tools import ToolContext, tool
from tests.support.builders import new_run, worker
from tests.support.running import finished
from tests.support.running import running as serving
from tests.support.waiting import eventually


async def cut_every_connection(db: psycopg.AsyncConnection[Any]) -> int:
    """What a pooler restart does: every other session of the database is ended at once."""
    cur = await db.execute(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
    )
    row = await cur.fetchone()
    return int(row[0]) if row else 0


async def lease_holders(db: psycopg.AsyncConnection[Any], run_id: uuid.UUID) -> list[str]:
    cur = await db.execute("SELECT worker FROM run_lease WHERE run_id = %s ORDER BY claimed_at", (run_id,))
    return [r[0] for r in await cur.fetchall()]


# -- 1. a live worker never loses a run to a connection blip -------------------------------------


class SlowToReconnect(RunStore):
    """A holder whose new sessions take half a second to open (a pooler coming back, a slow network):
    the liveness lock of its dropped session stays free all that while."""

    async def dedicated_connection(self) -> psycopg.AsyncConnection[Any]:
        await asyncio.sleep(0.5)
        return await super().dedicated_connection()


async def test_cutting_every_connection_mid_tool_hands_no_run_to_another_worker(
    store: RunStore, db: psycopg.AsyncConnection[Any]
) -> None:
    """Three cuts of every client connection while a non-idempotent tool runs: another worker is idle
    and looking the whole time, yet the holder keeps its run, the tool runs once, the run succeeds."""
    runs: list[str] = []
    started, cuts_done = asyncio.Event(), asyncio.Event()

    @tool(name="charge", idempotent=False)
    async def charge(args: dict[str, Any], ctx: ToolContext) -> str:
        runs.append(ctx.tool_use_id)
        started.set()
        await cuts_done.wait()
        return "charged"

    def llm() -> ScriptedLlm:
        return ScriptedLlm().then_tool_use("toolu_1", "charge", {}, 10, 5).then_text("done", 10, 5)

    run, _ = await store.create(new_run())
    lease = 60.0  # a liveness grace of 2 s: four times the holder's half-second reconnect
    a = worker(SlowToReconnect(store.pool), llm(), [charge], name="worker-A", lease=lease)
    async with serving(a):
        await asyncio.wait_for(started.wait(), 30)
        b = worker(store, llm(), [charge], name="worker-B", lease=lease)  # idle, polling every 50 ms
        async with serving(b):
            for _ in range(3):
                assert await cut_every_connection(db) >= 1
                await eventually(lambda: _true(not a.presence.ready.is_set()), 20, "worker-A to notice the cut")
                await eventually(lambda: _true(a.presence.ready.is_set()), 20, "worker-A's presence to come back")
                # Past the grace: had worker-B marked A as gone, it would have taken the run by now.
                await asyncio.sleep(a.settings.takeover_grace * 1.5)
            cuts_done.set()
            after = await finished(store, run.id)
    assert after.status is RunStatus.SUCCEEDED, after.error
    assert runs == ["toolu_1"]
    assert await lease_holders(db, run.id) == ["worker-A"]
    assert after.crashes == 0


class SlowPresence(RunStore):
    """A holder whose presence sessions, once `slow` is set, take `delay` seconds to open (a slow DNS, TLS
    or authentication step) while its pool, already connected, stays fast."""

    def __init__(self, pool: Any, delay: float) -> None:
        super().__init__(pool)
        self.delay = delay
        self.slow = False
        self.attempts = 0

    async def dedicated_connection(self) -> psycopg.AsyncConnection[Any]:
        if self.slow:
            self.attempts += 1
            await asyncio.sleep(self.delay)
        return await super().dedicated_connection()


async def presence_pid(db: psycopg.AsyncConnection[Any], worker_id: str) -> int | None:
    """The backend holding `worker_id`'s liveness lock, None if none does."""
    cur = await db.execute(
        """SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND classid::bigint = %s
           AND objid::bigint = (hashtext(%s)::bigint + 4294967296) %% 4294967296 AND objsubid = 2""",
        (LIVENESS_LOCK_CLASS, worker_id))
    row = await cur.fetchone()
    return int(row[0]) if row else None


async def test_a_reconnect_slower_than_the_grace_hands_no_run_over_while_the_pool_renews(
    store: RunStore, db: psycopg.AsyncConnection[Any]
) -> None:
    """Worker-A's presence session is terminated and its reconnect takes 3 s, three times the 1 s grace,
    while its pool keeps working; worker-B polls every 50 ms. A vouches through its pool on a schedule of
    its own while its connect attempt hangs, so B never takes the run and the tool runs once."""
    calls: list[str] = []
    started, release = asyncio.Event(), asyncio.Event()

    def slow_step_on(name: str) -> Any:
        @tool(name="slow_step")
        async def slow_step(args: dict[str, Any], ctx: ToolContext) -> str:
            calls.append(name)
            started.set()
            await release.wait()
            return "done"
        return slow_step

    def llm() -> ScriptedLlm:
        return ScriptedLlm().then_tool_use("toolu_1", "slow_step", {}, 10, 5).then_text("done", 10, 5)

    run, _ = await store.create(new_run())
    a_store = SlowPresence(store.pool, delay=3.0)
    a = worker(a_store, llm(), [slow_step_on("worker-A")], name="worker-A", lease=30.0)  # a grace of 1 s
    assert a.settings.takeover_grace == 1.0
    async with serving(a):
        await asyncio.wait_for(started.wait(), 30)
        b = worker(store, llm(), [slow_step_on("worker-B")], name="worker-B", lease=30.0)
        async with serving(b):
            await eventually(lambda: _true(b.presence.ready.is_set()), 20, "worker-B's presence")
            pid = await presence_pid(db, "worker-A")
            assert pid is not None
            a_store.slow = True
            await db.execute("SELECT pg_terminate_backend(%s)", (pid,))
            await eventually(lambda: _true(not a.presence.ready.is_set()), 20, "worker-A to notice the cut")
            await eventually(lambda: _true(a.presence.ready.is_set()), 30, "worker-A's slow reconnect")
            assert a_store.attempts >= 1
            # B polled all along: had it found A's suspicion older than the grace, it would hold the run now.
            assert await lease_holders(db, run.id) == ["worker-A"]
            release.set()
            after = await finished(store, run.id)
    assert after.status is RunStatus.SUCCEEDED, after.error
    assert calls == ["worker-A"]
    assert await lease_holders(db, run.id) == ["worker-A"]
    assert after.crashes == 0


async def test_a_killed_workers_run_moves_long_before_its_lease_lapses(
    store: RunStore, database_url: str, db: psycopg.AsyncConnection[Any]
) -> None:
    """A dead worker's session ends with it and never comes back: its run is taken long before the
    lease lapses: here under 20 s of a 120 s lease, a bound a loaded machine keeps (the figure on a quiet
    one, about 3 s of a 30 s lease, is measured by bench/failover.py)."""
    run, _ = await store.create(new_run())
    dead = await psycopg.AsyncConnection.connect(database_url, autocommit=True)
    await dead.execute("SELECT pg_advisory_lock(%s, hashtext('worker-gone'))", (LIVENESS_LOCK_CLASS,))
    assert await store.claim("worker-gone", 120.0)
    b = worker(store, ScriptedLlm().then_text("done", 10, 5), [], name="worker-B", poll=1.0)
    async with serving(b):
        await dead.close()  # SIGKILL: PostgreSQL ends the session and frees the lock
        t0 = time.monotonic()
        after = await finished(store, run.id, timeout=25)
        moved = time.monotonic() - t0
    assert after.status is RunStatus.SUCCEEDED
    assert await lease_holders(db, run.id) == ["worker-gone", "worker-B"]
    assert after.crashes == 1
    assert moved < 20  # far less than the 120 s lease: the liveness lock, not the lease, moved it


async def test_the_presence_connection_reconnects_long_before_the_next_poll(
    store: RunStore, db: psycopg.AsyncConnection[Any]
) -> None:
    a = worker(store, ScriptedLlm(), [], name="worker-A", poll=60.0)
    async with serving(a):
        await eventually(lambda: _true(a.presence.ready.is_set()), 20, "worker-A's presence")
        cut_at = time.monotonic()
        await cut_every_connection(db)
        await eventually(lambda: _true(not a.presence.ready.is_set()), 20, "worker-A to notice the cut")
        await eventually(lambda: _true(a.presence.ready.is_set()), 20, "worker-A's presence to come back")
        back_after = time.monotonic() - cut_at
    # Sub-second reconnect delays (jittered, 0.02–0.2 s), plus the probe that notices a silent cut: well
    # under 10 s even on a loaded machine, and far from the 60 s poll.
    assert back_after < 10


async def _true(value: bool) -> bool:
    return value


# -- 2. leases given up before they can be taken -------------------------------------------------


@dataclasses.dataclass(frozen=True)
class GivenUp:
    """A blocked tool call, cancelled: how much of its run's lease was left then (seconds, by the database's
    clock), the run's lease epoch then, and the epoch of the claim the call ran under."""

    lease_left: float
    epoch_then: int
    epoch_of_call: int


def _blocking_tool(db: psycopg.AsyncConnection[Any]) -> tuple[Any, asyncio.Event, list[GivenUp]]:
    """A tool `slow` that blocks until cancelled, then records what it found (GivenUp) and sets the event."""
    cancelled = asyncio.Event()
    given_up: list[GivenUp] = []

    @tool(name="slow")
    async def slow(args: dict[str, Any], ctx: ToolContext) -> str:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cur = await db.execute(
                "SELECT extract(epoch FROM locked_until - now()), lease_epoch FROM run WHERE id = %s", (ctx.run_id,)
            )
            row = await cur.fetchone()
            assert row is not None
            given_up.append(GivenUp(float(row[0]), int(row[1]), ctx.lease_epoch))
            cancelled.set()
            raise
        return "never"

    return slow, cancelled, given_up


async def _given_up_in_time(db: psycopg.AsyncConnection[Any], run_id: uuid.UUID, given_up: list[GivenUp],
                            at_least: float) -> None:
    """The first call was given up under the claim it ran under, with at least `at_least` seconds of that
    lease left, and the run had one holder: not let lapse and claimed again (by anyone, its worker too)."""
    assert given_up, "the call was never cancelled"
    first = given_up[0]
    assert first.epoch_then == first.epoch_of_call, f"claimed again before the call was given up: {first}"
    assert first.lease_left > at_least, f"given up too late: {first}"
    assert await lease_holders(db, run_id) == ["worker-A"]


class HangingRenewals(RunStore):
    """A database that accepts claims and writes but whose renewals never answer (a dead socket)."""

    async def renew(self, run_ids: Any, worker: str, lease_seconds: float, epochs: Any = None) -> dict[uuid.UUID, bool]:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def test_a_worker_that_cannot_renew_gives_up_before_the_lease_lapses(
    store: RunStore, db: psycopg.AsyncConnection[Any]
) -> None:
    slow, cancelled, given_up = _blocking_tool(db)

    run, _ = await store.create(new_run())
    lease = 6.0
    a = worker(HangingRenewals(store.pool), ScriptedLlm().then_tool_use("toolu_1", "slow", {}), [slow],
               name="worker-A", lease=lease)
    async with serving(a):
        with contextlib.suppress(TimeoutError):  # the assertions below say what went wrong
            await asyncio.wait_for(cancelled.wait(), lease * 4)
        # Given up at two thirds of the lease, renewal attempts bounded: a third of it was still the worker's.
        await _given_up_in_time(db, run.id, given_up, lease / 4)
    steps = await store.steps(run.id)
    assert [s.status for s in steps] == [StepStatus.DONE, StepStatus.STARTED]


class StubbornRenewals(RunStore):
    """Renewals that answer once, then hang and take their time to give in when cancelled: psycopg waits
    for the query and then for its cancel request, seconds each, on a connection that has stalled."""

    renewed = 0

    async def renew(self, run_ids: Any, worker: str, lease_seconds: float, epochs: Any = None) -> dict[uuid.UUID, bool]:
        if not self.renewed:
            self.renewed += 1
            return await super().renew(run_ids, worker, lease_seconds, epochs)
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await asyncio.sleep(lease_seconds * 3)  # deaf to the cancel for three leases
            raise
        raise AssertionError("unreachable")


async def test_a_renewal_deaf_to_its_cancel_still_gives_the_run_up_in_time(
    store: RunStore, db: psycopg.AsyncConnection[Any]
) -> None:
    """The give-up mark does not wait for a stuck renewal to end: the run is let go with a third of its
    lease left, however long the stuck query takes to be cancelled."""
    slow, cancelled, given_up = _blocking_tool(db)

    run, _ = await store.create(new_run())
    lease = 6.0
    a = worker(StubbornRenewals(store.pool), ScriptedLlm().then_tool_use("toolu_1", "slow", {}), [slow],
               name="worker-A", lease=lease)
    async with serving(a):
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(cancelled.wait(), lease * 4)
        await _given_up_in_time(db, run.id, given_up, lease / 6)


async def test_a_stalled_connection_under_the_renewal_gives_the_run_up_in_time(database_url: str) -> None:
    """The same with a real stall: the pool's one connection stops answering (psycopg then waits for the
    query, and for its cancel request): the run is given up while the database still counts it leased."""
    from agentrun.worker.runtime.lease import LeaseKeeper
    from agentrun.worker.store.pool import open_pool
    from bench.fault_proxy import Fault, FaultProxy

    proxy = await FaultProxy(database_url).start()
    pool = await open_pool(proxy.url, max_size=1)
    stall: asyncio.Task[None] | None = None
    heartbeat: asyncio.Task[None] | None = None
    try:
        store = RunStore(pool)
        run, _ = await store.create(new_run())
        lease = 4.5
        claimed = await store.claim("worker-A", lease)
        assert claimed is not None
        driver = asyncio.create_task(asyncio.Event().wait())
        keeper = LeaseKeeper(store, "worker-A", lease)
        keeper.hold(run.id, driver, claimed.run.lease_epoch)
        heartbeat = asyncio.create_task(keeper.run())
        await eventually(lambda: _true(keeper.renewals > 0), 20, "a first renewal")
        stall = asyncio.create_task(proxy.inject(Fault(0, "stall", lease * 3, 0.0), 0))
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(driver, lease * 2)
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
            cur = await conn.execute("SELECT locked_until > now(), lease_epoch FROM run WHERE id = %s", (run.id,))
            # Given up before anyone else could take it, under the claim it was held by.
            assert await cur.fetchone() == (True, claimed.run.lease_epoch)
    finally:
        if heartbeat is not None:
            heartbeat.cancel()
            await asyncio.gather(heartbeat, return_exceptions=True)
        if stall is not None:
            stall.cancel()
            await asyncio.gather(stall, return_exceptions=True)
        await proxy.stop()
        await pool.close()


async def test_a_claim_counts_its_lease_from_when_it_was_sent_not_from_waiting_for_a_connection(
    database_url: str,
) -> None:
    """After an outage the pool may take seconds to hand out a connection: that wait is not lease time
    spent (the database starts the lease when it runs the statement), so it must not bring the give-up
    mark closer."""
    from agentrun.worker.store.pool import open_pool

    pool = await open_pool(database_url, max_size=1)
    try:
        store = RunStore(pool)
        await store.create(new_run())
        taken = asyncio.Event()
        released_at = 0.0

        async def hog() -> None:
            nonlocal released_at
            async with pool.connection():
                taken.set()
                await asyncio.sleep(0.5)
                released_at = time.monotonic()

        hogging = asyncio.create_task(hog())
        await taken.wait()
        claimed = await store.claim("worker-A", 30.0)
        await hogging
        assert claimed is not None
        assert claimed.sent_at >= released_at
    finally:
        await pool.close()


async def test_a_run_held_with_a_third_of_its_lease_spent_is_renewed_at_once(store: RunStore) -> None:
    """A claim slow to answer arrives with part of its lease gone: the heartbeat renews it now rather
    than at the renewal it had planned (here 20 s away, past nothing, but 15 s from the give-up mark)."""
    from agentrun.worker.runtime.lease import LeaseKeeper

    run, _ = await store.create(new_run())
    lease = 60.0
    claimed = await store.claim("worker-A", lease)
    assert claimed is not None
    keeper = LeaseKeeper(store, "worker-A", lease)
    heartbeat = asyncio.create_task(keeper.run())
    driver = asyncio.create_task(asyncio.Event().wait())
    try:
        await asyncio.sleep(0)  # the heartbeat is asleep, planning its next renewal a third of a lease away
        keeper.hold(run.id, driver, claimed.run.lease_epoch, since=time.monotonic() - lease / 2.4)
        await eventually(lambda: _true(keeper.renewals > 0), 10, "the renewal of the late claim")
        assert not driver.done()
    finally:
        for task in (heartbeat, driver):
            task.cancel()
        await asyncio.gather(heartbeat, driver, return_exceptions=True)


async def test_renewals_are_bounded_in_time(store: RunStore) -> None:
    from agentrun.worker.runtime.lease import LeaseKeeper

    keeper = LeaseKeeper(HangingRenewals(store.pool), "worker-A", lease_seconds=3.0)
    keeper.hold(uuid.uuid4(), asyncio.current_task())  # type: ignore[arg-type]
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        await keeper.renew()
    assert time.monotonic() - t0 < 3.0 * 2 / 3


async def test_the_pool_validates_connections_after_a_restart(store: RunStore, db: psycopg.AsyncConnection[Any]) -> None:
    """Connections idle in the pool die with a cut; the next checkout gets a live one, not an error."""
    for _ in range(3):
        await store.get(uuid.uuid4())
    await cut_every_connection(db)

    async def gone() -> bool:  # the terminated sessions have ended (pg_terminate_backend only signals them)
        cur = await db.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        row = await cur.fetchone()
        return row is not None and row[0] == 0

    await eventually(gone, 20, "the cut sessions to end")
    assert await store.get(uuid.uuid4()) is None


class LosesAnswers(RunStore):
    """The write is committed, then the connection drops before its answer arrives: the outcome is
    unknown to the worker. Happens once per kind of write named in `lose`."""

    def __init__(self, pool: Any, lose: set[str]) -> None:
        super().__init__(pool)
        self.lose = set(lose)
        self.lost: list[str] = []

    def _drop(self, what: str) -> None:
        if what in self.lose:
            self.lose.discard(what)
            self.lost.append(what)
            raise psycopg.OperationalError("server closed the connection unexpectedly (after the commit)")

    async def checkpoint_turn(self, *a: Any, **kw: Any) -> Any:
        result = await super().checkpoint_turn(*a, **kw)
        self._drop("checkpoint")
        return result

    async def start_tool(self, *a: Any, **kw: Any) -> Any:
        result = await super().start_tool(*a, **kw)
        self._drop("start_tool")
        return result

    async def finish_tool(self, *a: Any, **kw: Any) -> Any:
        result = await super().finish_tool(*a, **kw)
        self._drop("finish_tool")
        return result

    async def finish(self, *a: Any, **kw: Any) -> Any:
        result = await super().finish(*a, **kw)
        self._drop("finish")
        return result


async def test_a_write_whose_answer_was_lost_is_retried_and_never_applied_twice(store: RunStore) -> None:
    executions: list[str] = []

    @tool(name="charge", idempotent=False)
    async def charge(args: dict[str, Any], ctx: ToolContext) -> str:
        executions.append(ctx.tool_use_id)
        return "charged"

    llm = ScriptedLlm().then_tool_use("toolu_1", "charge", {}, 10, 5).then_text("done", 20, 7)
    losing = LosesAnswers(store.pool, {"checkpoint", "start_tool", "finish_tool", "finish"})
    run, _ = await store.create(new_run())
    async with serving(worker(losing, llm, [charge])):
        after = await finished(store, run.id)
    assert sorted(losing.lost) == ["checkpoint", "finish", "finish_tool", "start_tool"]
    assert after.status is RunStatus.SUCCEEDED, after.error
    assert executions == ["toolu_1"]  # the finished tool was not run again for its lost answer
    assert len(llm.seen) == 2  # no model call repeated
    steps = await store.steps(run.id)
    assert [(s.kind.value, s.status.value, s.attempts) for s in steps] == [
        ("MODEL", "DONE", 1), ("TOOL", "DONE", 1), ("MODEL", "DONE", 1)
    ]
    assert after.tokens_used == 42  # each model step counted once


# -- 3. cancel interrupts the step in flight -------------------------------------------------------


async def test_cancel_interrupts_a_long_tool_and_records_it_cancelled(store: RunStore) -> None:
    started = asyncio.Event()

    @tool(name="slow")
    async def slow(args: dict[str, Any], ctx: ToolContext) -> str:
        started.set()
        await asyncio.sleep(30)
        return "too late"

    run, _ = await store.create(new_run())
    # A 300 s lease renews every 100 s: only the cancel notification can end the run within the bound.
    async with serving(worker(store, ScriptedLlm().then_tool_use("toolu_1", "slow", {}), [slow], lease=300.0)):
        await asyncio.wait_for(started.wait(), 30)
        t0 = time.monotonic()
        await store.cancel(run.id)
        after = await finished(store, run.id, timeout=20)
        took = time.monotonic() - t0
    assert after.status is RunStatus.CANCELLED
    steps = await store.steps(run.id)
    assert steps[-1].status is StepStatus.ERROR and steps[-1].response == "cancelled"
    assert took < 15  # by notification, not after the 30 s tool nor the 100 s heartbeat


class SlowModel:
    def __init__(self) -> None:
        self.calls = 0
        self.in_flight = asyncio.Event()

    async def send(self, request: LlmRequest) -> LlmResponse:
        self.calls += 1
        self.in_flight.set()
        await asyncio.sleep(30)
        raise AssertionError("the call should have been interrupted")


async def test_cancel_interrupts_a_long_model_call(store: RunStore) -> None:
    llm = SlowModel()
    run, _ = await store.create(new_run())
    async with serving(worker(store, llm, [])):
        await asyncio.wait_for(llm.in_flight.wait(), 30)
        await store.cancel(run.id)
        after = await finished(store, run.id, timeout=20)
    assert after.status is RunStatus.CANCELLED and after.error == "cancel requested"
    assert llm.calls == 1 and await store.steps(run.id) == []


async def test_a_cancel_missed_by_the_notification_is_seen_by_the_heartbeat(
    store: RunStore, db: psycopg.AsyncConnection[Any]
) -> None:
    llm = SlowModel()
    run, _ = await store.create(new_run())
    async with serving(worker(store, llm, [], lease=3.0)):
        await asyncio.wait_for(llm.in_flight.wait(), 30)
        # Set behind the trigger's back: no notification, only the renewal's answer carries it.
        await db.execute("ALTER TABLE run DISABLE TRIGGER run_cancel_notify")
        await db.execute("UPDATE run SET cancel_requested = true WHERE id = %s", (run.id,))
        after = await finished(store, run.id, timeout=20)
    assert after.status is RunStatus.CANCELLED


# -- 4. the claim loop survives every database error -----------------------------------------------


class ReadOnlyForAWhile(RunStore):
    """A failover: the first claims hit a server that is read-only."""

    def __init__(self, pool: Any, failures: int) -> None:
        super().__init__(pool)
        self.failures = failures

    async def claim_many(self, *a: Any, **kw: Any) -> Any:
        if self.failures > 0:
            self.failures -= 1
            async with self.pool.connection() as conn:
                await conn.execute("SET TRANSACTION READ ONLY")  # harmless on an autocommit connection
                await conn.execute("BEGIN READ ONLY")
                try:
                    await conn.execute("INSERT INTO worker_suspect (worker) VALUES ('x')")
                finally:
                    await conn.execute("ROLLBACK")
        return await super().claim_many(*a, **kw)


async def test_the_claim_loop_survives_a_read_only_database(store: RunStore) -> None:
    flaky = ReadOnlyForAWhile(store.pool, failures=3)
    run, _ = await store.create(new_run())
    async with serving(worker(flaky, ScriptedLlm().then_text("done", 10, 5), [], poll=0.05)):
        after = await finished(store, run.id)
    assert flaky.failures == 0 and after.status is RunStatus.SUCCEEDED


# -- 7. poison runs -----------------------------------------------------------------------------------


async def test_a_run_that_keeps_killing_its_workers_ends_failed(
    store: RunStore, db: psycopg.AsyncConnection[Any]
) -> None:
    run, _ = await store.create(new_run())
    for i in range(10):  # ten workers took it and died mid-step, each leaving its lease to lapse
        assert await store.claim(f"victim-{i}", 30.0)
        await db.execute("UPDATE run SET locked_until = now() - interval '1 second' WHERE id = %s", (run.id,))
    llm = ScriptedLlm().then_text("never asked")
    async with serving(worker(store, llm, [])):
        after = await finished(store, run.id)
    assert after.status is RunStatus.FAILED
    assert after.error is not None and "taken over 10 times" in after.error
    assert llm.seen == []


async def test_runs_handed_back_cleanly_are_not_counted_as_crashes(store: RunStore) -> None:
    run, _ = await store.create(new_run())
    for i in range(12):  # drained on SIGTERM again and again: every time at a checkpoint
        assert await store.claim(f"worker-{i}", 30.0)
        assert await store.release(run.id, f"worker-{i}")
    async with serving(worker(store, ScriptedLlm().then_text("done", 10, 5), [])):
        after = await finished(store, run.id)
    assert after.status is RunStatus.SUCCEEDED and after.crashes == 0



async def test_a_container_restarted_under_the_same_pod_name_takes_the_dead_processs_run_at_once(
    store: RunStore, database_url: str, db: psycopg.AsyncConnection[Any]
) -> None:
    """The chart's identity, --id-prefix $(POD_NAME): a process that dies holding a run and the process
    the container starts next, with the same arguments, are two workers. The new one finds the dead
    one's liveness lock free and takes the run while its 60 s lease is still live; under one id, the new
    process would hold that very lock itself, and the run would wait out the lease."""
    args = ["worker", "--id-prefix", "agentrun-worker-7d9f-x2k4q"]
    dead_id, new_id = (cli.worker_id(cli.build_parser().parse_args(args)) for _ in range(2))
    assert dead_id != new_id
    assert dead_id.startswith("agentrun-worker-7d9f-x2k4q-") and new_id.startswith("agentrun-worker-7d9f-x2k4q-")

    run, _ = await store.create(new_run())
    dead = await psycopg.AsyncConnection.connect(database_url, autocommit=True)  # the dead process's presence
    await dead.execute("SELECT pg_advisory_lock(%s, hashtext(%s))", (LIVENESS_LOCK_CLASS, dead_id))
    held = await store.claim(dead_id, 60.0)
    assert held is not None and held.run.locked_until is not None
    await dead.close()  # SIGKILL: PostgreSQL ends the session and frees the lock
    new = worker(store, ScriptedLlm().then_text("done", 10, 5), [], name=new_id, lease=60.0)
    async with serving(new):
        after = await finished(store, run.id, timeout=50)
    assert after.status is RunStatus.SUCCEEDED
    assert await lease_holders(db, run.id) == [dead_id, new_id]
    cur = await db.execute("SELECT max(claimed_at) FROM run_lease WHERE run_id = %s", (run.id,))
    taken = await cur.fetchone()
    # Taken while the dead process's lease was still live: by its free liveness lock, not by the lease.
    assert taken is not None and taken[0] < held.run.locked_until
