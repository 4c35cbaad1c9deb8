"""Durable timers and waits for outside events, driven by in-process workers over real PostgreSQL: a run
parked for a timer or an event holds no lease, resumes once with the wait's result, gets an event posted
before it waited, never the same event twice, times out, is cancelled at once, and sleeps for free."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import uuid
from typing import Any

import pytest

from agentrun.worker.core.records import RunStatus, StepKind, StepStatus
from agentrun.worker.store import RunStore
from agentrun.worker.testing.scripted import ScriptedLlm
from agentrun.worker.tools import ToolContext, WaitForEvent, tool
from tests.support.builders import SimulatedCrash, new_run, worker
from tests.support.running import finished, running
from tests.support.waiting import eventually


async def tool_steps(store: RunStore, run_id: uuid.UUID) -> list[tuple[str | None, StepStatus, str | None]]:
    return [(s.tool_use_id, s.status, s.response) for s in await store.steps(run_id) if s.kind is StepKind.TOOL]


async def parked(store: RunStore, run_id: uuid.UUID, kind: str) -> None:
    async def waiting() -> bool:
        run = await store.get(run_id)
        return run is not None and run.status is RunStatus.WAITING and run.waiting_for == kind
    await eventually(waiting, 30, f"the run parked for its {kind}")


async def test_a_timer_parks_the_run_with_no_lease_and_resumes_it_once_with_how_long_it_waited(store: RunStore) -> None:
    run, _ = await store.create(new_run(tools=("wait",)))
    # Long enough that the run is still asleep when looked at below, on a loaded machine too.
    llm = ScriptedLlm().then_tool_use("toolu_t", "wait", {"seconds": 3}).then_text("rested")
    async with running(worker(store, llm)):
        await parked(store, run.id, "timer")
        sleeping = await store.get(run.id)
        assert sleeping is not None and sleeping.locked_by is None and sleeping.pending == 1
        pending = await store.pending_wait(run.id)
        assert pending is not None and pending.kind == "timer" and pending.key is None
        done = await finished(store, run.id)
    assert done.status is RunStatus.SUCCEEDED, done.error
    [(tuid, status, output)] = await tool_steps(store, run.id)
    assert (tuid, status) == ("toolu_t", StepStatus.DONE) and output is not None and output.startswith("waited ")
    assert 2.9 <= float(output.split()[1]) < 15
    assert [t["name"] for t in llm.seen[0].tools] == ["wait"]  # offered because the run lists it


async def test_the_built_in_waits_are_offered_only_to_a_run_that_lists_them(store: RunStore) -> None:
    run, _ = await store.create(new_run())
    llm = ScriptedLlm().then_text("no tools")
    async with running(worker(store, llm)):
        await finished(store, run.id)
    assert [t["name"] for t in llm.seen[0].tools] == []


@pytest.mark.parametrize("args, problem", [
    ({"seconds": -1}, "minimum of 0"), ({"until": "tomorrow"}, "until"), ({}, "exactly one"),
    ({"seconds": 1, "until": "2030-01-01T00:00:00Z"}, "exactly one"), ({"until": "2030-01-01T00:00:00"}, "offset"),
])
async def test_a_bad_timer_from_the_model_is_an_error_result_and_the_run_goes_on(
    store: RunStore, args: dict[str, Any], problem: str
) -> None:
    run, _ = await store.create(new_run(tools=("wait",)))
    llm = ScriptedLlm().then_tool_use("toolu_bad", "wait", args).then_text("gave up waiting")
    async with running(worker(store, llm)):
        done = await finished(store, run.id)
    assert done.status is RunStatus.SUCCEEDED, done.error
    [(_, status, output)] = await tool_steps(store, run.id)
    assert status is StepStatus.ERROR and output is not None and problem in output


async def test_an_event_posted_before_its_waiter_is_delivered_without_parking(store: RunStore) -> None:
    posted = await store.post_event("reply:1", {"text": "yes"})
    assert posted.woke == [] and not posted.replayed
    run, _ = await store.create(new_run(tools=("wait_for_event",)))
    llm = ScriptedLlm().then_tool_use("toolu_e", "wait_for_event", {"key": "reply:1", "timeoutSeconds": 60})
    llm.then_text("got it")
    async with running(worker(store, llm)):
        done = await finished(store, run.id)
    assert done.status is RunStatus.SUCCEEDED, done.error
    assert await tool_steps(store, run.id) == [("toolu_e", StepStatus.DONE, '{"text":"yes"}')]


async def test_an_event_wakes_the_runs_waiting_on_its_key_and_a_second_wait_gets_the_next_event(store: RunStore) -> None:
    run, _ = await store.create(new_run(tools=("wait_for_event",)))
    llm = ScriptedLlm()
    llm.then_tool_use("toolu_1", "wait_for_event", {"key": "ci", "timeoutSeconds": 60})
    llm.then_tool_use("toolu_2", "wait_for_event", {"key": "ci", "timeoutSeconds": 60})
    llm.then_text("both")
    async with running(worker(store, llm)):
        await parked(store, run.id, "event")
        pending = await store.pending_wait(run.id)
        assert pending is not None and pending.kind == "event" and pending.key == "ci"
        first = await store.post_event("ci", {"n": 1})
        assert first.woke == [run.id]
        await eventually(lambda: _steps_done(store, run.id, 1), 30, "the first event recorded")
        await parked(store, run.id, "event")  # not given the first event again
        second = await store.post_event("ci", {"n": 2})
        assert second.woke == [run.id]
        done = await finished(store, run.id)
    assert done.status is RunStatus.SUCCEEDED, done.error
    assert await tool_steps(store, run.id) == [
        ("toolu_1", StepStatus.DONE, '{"n":1}'), ("toolu_2", StepStatus.DONE, '{"n":2}')]


async def _steps_done(store: RunStore, run_id: uuid.UUID, n: int) -> bool:
    return sum(1 for _, s, _ in await tool_steps(store, run_id) if s is not StepStatus.STARTED) >= n


async def test_an_event_wait_that_times_out_is_an_error_result_the_model_sees(store: RunStore) -> None:
    run, _ = await store.create(new_run(tools=("wait_for_event",)))
    llm = ScriptedLlm().then_tool_use("toolu_x", "wait_for_event", {"key": "never", "timeoutSeconds": 0.5})
    llm.then_text("moving on")
    async with running(worker(store, llm)):
        done = await finished(store, run.id)
    assert done.status is RunStatus.SUCCEEDED, done.error
    assert await tool_steps(store, run.id) == [("toolu_x", StepStatus.ERROR, "timed out waiting for event never")]


@tool(name="send_mail", description="Send a mail and wait for its reply.")
def send_mail(args: dict[str, Any], ctx: ToolContext) -> WaitForEvent:
    return WaitForEvent(f"mail:{ctx.run_id}", 60)


async def test_a_python_tool_asks_the_run_to_wait_for_an_event_and_gets_its_payload(store: RunStore) -> None:
    run, _ = await store.create(new_run(tools=("send_mail",)))
    llm = ScriptedLlm().then_tool_use("toolu_m", "send_mail", {}).then_text("replied")
    async with running(worker(store, llm, [send_mail])):
        await parked(store, run.id, "event")
        assert (await store.post_event(f"mail:{run.id}", ["a", 2])).woke == [run.id]
        done = await finished(store, run.id)
    assert done.status is RunStatus.SUCCEEDED, done.error
    assert await tool_steps(store, run.id) == [("toolu_m", StepStatus.DONE, '["a",2]')]


async def test_a_retried_post_answers_the_first_answer_and_delivers_nothing_twice(store: RunStore, db: Any) -> None:
    run, _ = await store.create(new_run(tools=("wait_for_event",)))
    llm = ScriptedLlm().then_tool_use("toolu_i", "wait_for_event", {"key": "pay", "timeoutSeconds": 60})
    llm.then_tool_use("toolu_j", "wait_for_event", {"key": "pay", "timeoutSeconds": 1}).then_text("paid")
    async with running(worker(store, llm)):
        await parked(store, run.id, "event")
        copies = await asyncio.gather(*(store.post_event("pay", {"ok": True}, idempotency_key="k-1") for _ in range(4)))
        assert all(c.woke == [run.id] for c in copies)
        assert sorted(c.replayed for c in copies) == [False, True, True, True]
        done = await finished(store, run.id)
    assert done.status is RunStatus.SUCCEEDED, done.error
    assert await tool_steps(store, run.id) == [
        ("toolu_i", StepStatus.DONE, '{"ok":true}'), ("toolu_j", StepStatus.ERROR, "timed out waiting for event pay")]
    cur = await db.execute("SELECT count(*) FROM run_event")
    assert (await cur.fetchone())[0] == 1


async def test_cancel_ends_a_sleeping_run_at_once(store: RunStore) -> None:
    run, _ = await store.create(new_run(tools=("wait",)))
    llm = ScriptedLlm().then_tool_use("toolu_s", "wait", {"seconds": 3600})
    async with running(worker(store, llm)):
        await parked(store, run.id, "timer")
        cancelled = await store.cancel(run.id)
    assert cancelled is not None and cancelled.status is RunStatus.CANCELLED
    assert cancelled.error == "cancelled while waiting (a timer)"


async def test_a_timer_past_the_deadline_ends_the_run_timed_out(store: RunStore) -> None:
    run, _ = await store.create(new_run(tools=("wait",), timeout_seconds=2))
    llm = ScriptedLlm().then_tool_use("toolu_l", "wait", {"until": "2999-01-01T00:00:00Z"})
    async with running(worker(store, llm)):
        done = await finished(store, run.id, 30)
    assert done.status is RunStatus.TIMED_OUT
    assert done.error is not None and "a timer" in done.error


class CrashAfterPark(RunStore):
    """The worker dies right after its park committed; an event is posted at the same moment."""

    def __init__(self, store: RunStore, key: str) -> None:
        super().__init__(store.pool)
        self.key, self.crashed = key, False

    async def park_event(self, run_id: uuid.UUID, worker: str, tool_use_id: str, key: str, **kw: Any) -> Any:
        if self.crashed:
            return await super().park_event(run_id, worker, tool_use_id, key, **kw)
        self.crashed = True
        await asyncio.gather(super().park_event(run_id, worker, tool_use_id, key, **kw),
                             RunStore(self.pool).post_event(self.key, {"raced": True}))
        raise SimulatedCrash


async def test_an_event_posted_while_the_run_parks_is_not_lost_when_its_worker_dies_right_after(
    store: RunStore
) -> None:
    run, _ = await store.create(new_run(tools=("wait_for_event",)))
    script = [("toolu_r", "wait_for_event", {"key": "race", "timeoutSeconds": 60})]
    crashing = worker(CrashAfterPark(store, "race"), ScriptedLlm().then_tool_uses(script), lease=2.0,
                      liveness_lock=False)
    with pytest.raises(SimulatedCrash):
        await crashing.run_once()
    llm = ScriptedLlm().then_text("raced")
    async with running(worker(store, llm, name="worker-B", liveness_lock=False)):
        done = await finished(store, run.id, 30)
    assert done.status is RunStatus.SUCCEEDED, done.error
    assert await tool_steps(store, run.id) == [("toolu_r", StepStatus.DONE, '{"raced":true}')]


class Counting(RunStore):
    """Counts the statements the store sends."""

    statements = 0

    async def _one(self, query: str, params: Any) -> Any:
        Counting.statements += 1
        return await super()._one(query, params)

    async def _all(self, query: str, params: Any) -> Any:
        Counting.statements += 1
        return await super()._all(query, params)


async def test_a_thousand_sleeping_runs_cost_no_query_of_their_own(store: RunStore, db: Any) -> None:
    sleepers = 1000
    await db.execute(
        """INSERT INTO run (id, input, model, token_budget, timeout_seconds, deadline_at, status, waiting_for,
                            wake_at, wait_tool_use_id, wait_since, started_at)
           SELECT gen_random_uuid(), 'sleep', 'm', 100, 7200, now() + interval '2 hours', 'WAITING', 'timer',
                  now() + interval '1 hour', 'toolu_' || g, now(), now()
           FROM generate_series(1, %s) AS g""",
        (sleepers,),
    )
    counting = Counting(store.pool)
    w = worker(counting, ScriptedLlm(), poll=1.0)
    async with running(w):
        await eventually(lambda: _true(w.sweeps >= 2), 30, "the sweep ran")
        before, sweeps = Counting.statements, w.sweeps
        await eventually(lambda: _true(w.sweeps >= sweeps + 3), 30, "three more sweeps")
        during, swept = Counting.statements - before, w.sweeps - sweeps
    # Each sweep is one statement, the idle loop a few per poll, housekeeping two every second or two: over
    # three sweeps (about six seconds) some tens, whatever the number asleep; a query per run would be 1,000.
    assert swept >= 3 and during < 30 * swept and during < sleepers / 10, (during, swept)
    cur = await db.execute("SELECT count(*) FROM run WHERE status = 'WAITING'")
    assert (await cur.fetchone())[0] == sleepers


async def _true(value: bool) -> bool:
    return value



async def test_an_event_older_than_the_retention_window_is_not_delivered_and_is_pruned(
    store: RunStore, db: Any
) -> None:
    from agentrun.worker.store.retention import prune_if_first

    await store.post_event("old", "stale")
    await store.post_event("fresh", "new")
    await db.execute("UPDATE run_event SET created_at = now() - interval '2 hours' WHERE key = 'old'")
    run, _ = await store.create(new_run(tools=("wait_for_event",)))
    llm = ScriptedLlm().then_tool_use("toolu_o", "wait_for_event", {"key": "old", "timeoutSeconds": 0.5})
    llm.then_text("none came")
    w = worker(store, llm)
    w.driver.settings = dataclasses.replace(w.driver.settings, event_retention=3600.0)
    async with running(w):
        done = await finished(store, run.id)
    assert await tool_steps(store, done.id) == [("toolu_o", StepStatus.ERROR, "timed out waiting for event old")]
    pruned = await prune_if_first(store.pool, None, event_retention=3600.0)
    assert pruned is not None and pruned.rows == {"run_event": 1}
    cur = await db.execute("SELECT key FROM run_event")
    assert [r[0] for r in await cur.fetchall()] == ["fresh"]


async def test_a_run_that_does_not_list_a_built_in_wait_cannot_call_it(store: RunStore) -> None:
    run, _ = await store.create(new_run())  # tools: None, every registered tool, but no built-in
    llm = ScriptedLlm().then_tool_use("toolu_n", "wait", {"seconds": 1}).then_text("fine")
    async with running(worker(store, llm)):
        done = await finished(store, run.id)
    assert await tool_steps(store, done.id) == [("toolu_n", StepStatus.ERROR, "error: unknown tool 'wait'")]


def test_the_operator_takes_the_built_in_waits_whatever_tools_it_was_told_of() -> None:
    from agentrun.operator import mapping

    offer = mapping.offer(frozenset({"lookup"}), None)
    assert offer.has_tool is not None
    assert offer.has_tool("wait") and offer.has_tool("wait_for_event") and offer.has_tool("lookup")
    assert not offer.has_tool("rm_rf")


class CrashOnSettle(RunStore):
    """The worker that resumes a woken run dies recording the wait's result: before the write, or after it
    committed and before its answer came back."""

    def __init__(self, store: RunStore, after: bool) -> None:
        super().__init__(store.pool)
        self.after, self.crashed = after, False

    async def settle_tool(self, run_id: uuid.UUID, worker: str, lease_seconds: float, **kw: Any) -> Any:
        if self.crashed:
            return await super().settle_tool(run_id, worker, lease_seconds, **kw)
        self.crashed = True
        if self.after:
            await super().settle_tool(run_id, worker, lease_seconds, **kw)
        raise SimulatedCrash


@pytest.mark.parametrize("after", [False, True], ids=["before-the-write", "after-the-write"])
async def test_a_crash_while_recording_a_waits_result_records_it_once(store: RunStore, after: bool) -> None:
    run, _ = await store.create(new_run(tools=("wait",)))
    # Asleep long enough to be seen parked (and worker-A stopped) before it is due, on a loaded machine too.
    first = ScriptedLlm().then_tool_use("toolu_w", "wait", {"seconds": 2})
    async with running(worker(store, first, name="worker-A", liveness_lock=False)):
        await parked(store, run.id, "timer")

    async def due() -> bool:
        found = await store.get(run.id)
        return found is not None and found.status is RunStatus.QUEUED

    sweeper = worker(store, ScriptedLlm(), name="worker-S", concurrency=0, liveness_lock=False)
    async with running(sweeper):  # wakes it, claims nothing
        await eventually(due, 30, "the timer woke the run")
    crashing = worker(CrashOnSettle(store, after), ScriptedLlm(), name="worker-B", lease=2.0, liveness_lock=False)
    with pytest.raises(SimulatedCrash):
        await crashing.run_once()
    last = ScriptedLlm().then_text("rested")
    async with running(worker(store, last, name="worker-C", liveness_lock=False)):
        done = await finished(store, run.id, 30)
    assert done.status is RunStatus.SUCCEEDED, done.error
    [(tuid, status, output)] = await tool_steps(store, run.id)
    assert (tuid, status) == ("toolu_w", StepStatus.DONE) and output is not None and output.startswith("waited ")
    assert len(last.seen) == 1  # the model asked once after the wait, by the worker that recorded it


class CancelWhileParking(RunStore):
    """A cancel request lands just before the park: the run is RUNNING then, so the cancel only asks."""

    async def park_timer(self, run_id: uuid.UUID, worker: str, tool_use_id: str, **kw: Any) -> None:
        await self._one("UPDATE run SET cancel_requested = true WHERE id = %s RETURNING id", (run_id,))
        await super().park_timer(run_id, worker, tool_use_id, **kw)


async def test_a_cancel_asked_while_the_run_parks_ends_it_soon_not_after_its_timer(store: RunStore) -> None:
    run, _ = await store.create(new_run(tools=("wait",)))
    llm = ScriptedLlm().then_tool_use("toolu_c", "wait", {"seconds": 3600})
    async with running(worker(CancelWhileParking(store.pool), llm)):
        done = await finished(store, run.id, 30)
    assert done.status is RunStatus.CANCELLED


def test_an_agentrun_waiting_for_a_timer_or_an_event_says_so() -> None:
    import datetime
    from decimal import Decimal

    from agentrun.operator import mapping
    from agentrun.worker.core.records import Run

    now = datetime.datetime.now(datetime.UTC)

    def waiting(kind: str) -> Run:
        return Run(uuid.uuid4(), RunStatus.WAITING, "x", "m", None, ("wait",), 100, 0, None, Decimal(0), 10, 60, now,
                   False, None, None, None, now, now, None, 1, waiting_for=kind)

    assert mapping.phase_message(waiting("timer")) == "waiting for a timer (the wait tool)"
    assert "POST /api/events" in mapping.phase_message(waiting("event"))


class CrashBeforeTheTimersPark(RunStore):
    """The worker dies after the `wait` call's STARTED row and before its park."""

    def __init__(self, store: RunStore) -> None:
        super().__init__(store.pool)

    async def park_timer(self, run_id: uuid.UUID, worker: str, tool_use_id: str, **kw: Any) -> None:
        raise SimulatedCrash


async def test_a_crash_between_a_timers_start_and_its_park_keeps_the_deadline_the_first_attempt_set(
    store: RunStore, db: Any
) -> None:
    """The call asks for 60 s. Its worker dies before the park, and the takeover comes 58 s after the call
    started (its STARTED row set back so: no test sleeps a minute). The run the call parks again wakes at
    the first start + 60 s, not 60 s after the takeover, and the model is told it waited the 60 s or more
    since the call started. (The re-executed call reset the step's start and parked for 60 s from then.)"""
    run, _ = await store.create(new_run(tools=("wait",)))
    crashing = worker(CrashBeforeTheTimersPark(store), ScriptedLlm().then_tool_use("toolu_w", "wait", {"seconds": 60}),
                      lease=2.0, liveness_lock=False)
    with pytest.raises(SimulatedCrash):
        await crashing.run_once()
    await db.execute("UPDATE run_step SET started_at = started_at - interval '58 seconds' "
                     "WHERE run_id = %s AND tool_use_id = 'toolu_w'", (run.id,))
    await db.execute("UPDATE run SET locked_until = now() WHERE id = %s", (run.id,))  # its lease lapses
    [first] = [s for s in await store.steps(run.id) if s.kind is StepKind.TOOL]
    assert first.status is StepStatus.STARTED and first.started_at is not None
    last = ScriptedLlm().then_text("rested")
    async with running(worker(store, last, name="worker-B", liveness_lock=False)):
        async def parked_again() -> bool:  # kept on the run once woken too
            state = await store.wait_state(run.id)
            return state is not None and state.tool_use_id == "toolu_w"
        await eventually(parked_again, 30, "the second worker to park the run for the call")
        state = await store.wait_state(run.id)
        assert state is not None
        assert state.wake_at == first.started_at + datetime.timedelta(seconds=60), (state.wake_at, first.started_at)
        done = await finished(store, run.id, 30)
    assert done.status is RunStatus.SUCCEEDED, done.error
    [step] = [s for s in await store.steps(run.id) if s.kind is StepKind.TOOL]
    assert step.status is StepStatus.DONE and step.attempts == 2 and step.started_at == first.started_at
    assert step.response is not None and step.response.startswith("waited ")
    told = float(step.response.split()[1])
    assert step.finished_at is not None
    assert 60 <= told <= (step.finished_at - first.started_at).total_seconds() + 0.1, (told, step)
