"""The tests that prove the design: crash, resume elsewhere, repeat nothing that was checkpointed."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import psycopg
import pytest

from agentrun.worker.core.records import RunStatus, StepStatus
from agentrun.worker.store import LeaseLost, RunStore
from agentrun.worker.testing.scripted import ScriptedLlm, TurnBasedLlm
from agentrun.worker.tools import ToolContext, tool
from tests.support.builders import SimulatedCrash, new_run, worker
from tests.support.waiting import eventually


async def expire_lease(db: psycopg.AsyncConnection[Any], run_id: uuid.UUID) -> None:
    await db.execute("UPDATE run SET locked_until = now() - interval '1 second' WHERE id = %s", (run_id,))


async def test_resumed_run_does_not_repeat_model_calls(store: RunStore, db: psycopg.AsyncConnection[Any]) -> None:
    llm = ScriptedLlm().then_tool_use("toolu_1", "lookup", {"q": "x"}, 100, 20).then_text("done", 150, 5)
    run, _ = await store.create(new_run("find x"))
    executed: list[str] = []

    @tool(name="lookup", description="finds things")
    async def lookup(args: dict[str, Any], ctx: ToolContext) -> str:
        executed.append(ctx.idempotency_key)
        if len(executed) == 1:
            raise SimulatedCrash()
        return "found"

    with pytest.raises(SimulatedCrash):
        await worker(store, llm, [lookup], "worker-A").run_once()
    await expire_lease(db, run.id)
    assert await worker(store, llm, [lookup], "worker-B").run_once() == run.id

    after = await store.get(run.id)
    assert after is not None and after.status is RunStatus.SUCCEEDED
    assert len(llm.seen) == 2  # the first model call was not repeated
    assert executed == ["toolu_1", "toolu_1"]  # the tool ran twice, with the same idempotency key
    steps = await store.timeline(run.id)
    assert [(s.seq, s.kind.value, s.status.value) for s in steps] == [(1, "MODEL", "DONE"), (2, "TOOL", "DONE"), (3, "MODEL", "DONE")]
    assert steps[1].attempts == 2 and steps[1].worker == "worker-B"
    assert after.tokens_used == 100 + 20 + 150 + 5
    # the resumed model call saw the tool_use and its result, once
    assert llm.seen[1].messages[2] == {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "found"}]}


async def test_crash_between_model_response_and_checkpoint_repeats_one_call(store: RunStore, db: psycopg.AsyncConnection[Any]) -> None:
    """The one unavoidable at-least-once window: the model answered, the worker died before writing."""

    class CrashAfterAnswer(ScriptedLlm):
        crashed = False

        async def send(self, request: Any) -> Any:
            response = await super().send(request)
            if not self.crashed:
                self.crashed = True
                self._script.appendleft(response)  # the "same" answer comes back on the repeat
                raise SimulatedCrash()
            return response

    llm = CrashAfterAnswer().then_text("hello", 10, 2)
    run, _ = await store.create(new_run())
    with pytest.raises(SimulatedCrash):
        await worker(store, llm, [], "worker-A").run_once()
    assert await store.timeline(run.id) == []
    await expire_lease(db, run.id)
    await worker(store, llm, [], "worker-B").run_once()
    after = await store.get(run.id)
    assert after is not None and after.status is RunStatus.SUCCEEDED
    assert len(llm.seen) == 2 and after.tokens_used == 12  # paid once in the counters, called twice


async def test_parallel_tool_uses_resume_mid_turn(store: RunStore, db: psycopg.AsyncConnection[Any]) -> None:
    llm = ScriptedLlm().then_tool_uses([("a", "echo", {"v": 1}), ("b", "echo", {"v": 2}), ("c", "echo", {"v": 3})]).then_text("ok")
    run, _ = await store.create(new_run())
    calls: list[str] = []

    @tool(name="echo")
    def echo(args: dict[str, Any], ctx: ToolContext) -> str:  # a plain function runs off the event loop
        calls.append(ctx.tool_use_id)
        if ctx.tool_use_id == "b" and calls.count("b") == 1:
            raise SimulatedCrash()
        return str(args["v"])

    with pytest.raises(SimulatedCrash):
        await worker(store, llm, [echo], "worker-A").run_once()
    await expire_lease(db, run.id)
    await worker(store, llm, [echo], "worker-B").run_once()
    assert calls == ["a", "b", "b", "c"]
    final = llm.seen[-1].messages
    assert final[-1] == {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "a", "content": "1"},
        {"type": "tool_result", "tool_use_id": "b", "content": "2"},
        {"type": "tool_result", "tool_use_id": "c", "content": "3"},
    ]}


async def test_worker_whose_lease_was_taken_writes_nothing_more(store: RunStore, db: psycopg.AsyncConnection[Any]) -> None:
    run, _ = await store.create(new_run())

    class TakenOverMidCall(ScriptedLlm):
        async def send(self, request: Any) -> Any:
            # While A waits on the model, its lease lapses and B claims the run.
            await expire_lease(db, run.id)
            claimed = await store.claim("worker-B", 30)
            assert claimed is not None and claimed.run.id == run.id
            return await super().send(request)

    llm = TakenOverMidCall().then_tool_use("toolu_1", "noop", {}, 5, 5)
    with pytest.raises(LeaseLost):
        await worker(store, llm, [], "worker-A").run_once()
    assert await store.timeline(run.id) == []  # the fenced checkpoint wrote no step
    after = await store.get(run.id)
    assert after is not None and after.tokens_used == 0 and after.locked_by == "worker-B"
    with pytest.raises(LeaseLost):
        await store.finish(run.id, "worker-A", RunStatus.FAILED, "stale")
    with pytest.raises(LeaseLost):
        await store.start_tool(run.id, "worker-A", 30, tool_use_id="x", tool_name="noop", request="{}")


async def test_heartbeat_keeps_a_step_longer_than_the_lease(store: RunStore, db: psycopg.AsyncConnection[Any]) -> None:
    """A tool that outlasts its first lease completes without a takeover. A 3 s lease renewed every
    second: a loaded machine may stall the heartbeat a second or two without the lease lapsing (with
    0.6 s, a 0.4 s stall let the rival take the run)."""
    lease = 3.0
    run, _ = await store.create(new_run())
    rival = worker(store, TurnBasedLlm(0), [], "worker-B", lease=lease)
    original_until: list[Any] = []

    @tool(name="slow")
    async def slow(args: dict[str, Any], ctx: ToolContext) -> str:
        cur = await db.execute("SELECT locked_until FROM run WHERE id = %s", (run.id,))
        original_until.append((await cur.fetchone())[0])  # type: ignore[index]

        async def renewed_past_the_first_lease() -> bool:
            cur = await db.execute(
                "SELECT locked_until > %s + make_interval(secs => %s) FROM run WHERE id = %s",
                (original_until[0], lease, run.id),
            )
            return bool((await cur.fetchone())[0])  # type: ignore[index]

        await eventually(renewed_past_the_first_lease, 30, what="the heartbeat to renew the lease")
        assert await rival.run_once() is None  # nothing claimable: the lease is alive
        return "slow result"

    llm = ScriptedLlm().then_tool_use("toolu_1", "slow", {}).then_text("done")
    await worker(store, llm, [slow], "worker-A", lease=lease).run_once()
    after = await store.get(run.id)
    assert after is not None and after.status is RunStatus.SUCCEEDED and after.locked_by == "worker-A"
    cur = await db.execute("SELECT worker FROM run_lease WHERE run_id = %s", (run.id,))
    assert [r[0] for r in await cur.fetchall()] == ["worker-A"]  # claimed once: never taken over meanwhile


async def test_lost_lease_cancels_the_step_in_flight(store: RunStore, db: psycopg.AsyncConnection[Any]) -> None:
    lease = 0.6
    run, _ = await store.create(new_run())
    cancelled = asyncio.Event()

    @tool(name="hang")
    async def hang(args: dict[str, Any], ctx: ToolContext) -> str:
        await db.execute("UPDATE run SET locked_by = 'worker-B' WHERE id = %s", (run.id,))  # a takeover
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "never"

    llm = ScriptedLlm().then_tool_use("toolu_1", "hang", {})
    with pytest.raises(LeaseLost):
        await worker(store, llm, [hang], "worker-A", lease=lease).run_once()
    assert cancelled.is_set()
    steps = await store.timeline(run.id)
    assert steps[-1].status is StepStatus.STARTED  # the stale worker did not record a result


async def test_exactly_once_under_concurrency(store: RunStore, db: psycopg.AsyncConnection[Any]) -> None:
    """3 workers × 50 runs: every run SUCCEEDED once, no duplicate steps, tokens add up."""
    llm = TurnBasedLlm(turns=2, tool="noop", in_=7, out=3)

    @tool(name="noop")
    async def noop(args: dict[str, Any], ctx: ToolContext) -> str:
        await asyncio.sleep(0)
        return "ok"

    ids = [(await store.create(new_run(f"run {i}")))[0].id for i in range(50)]
    workers = [worker(store, llm, [noop], f"worker-{n}", concurrency=4, poll=0.01) for n in "ABC"]
    serving = [asyncio.create_task(w.run()) for w in workers]

    async def all_done() -> bool:
        cur = await db.execute("SELECT count(*) FROM run WHERE status = 'SUCCEEDED'")
        return (await cur.fetchone())[0] == len(ids)  # type: ignore[index]

    try:
        await eventually(all_done, timeout=60, what="all runs to succeed")
    finally:
        for w in workers:
            w.stop()
        await asyncio.gather(*serving)

    cur = await db.execute(
        """SELECT r.id, r.tokens_used, r.claims, count(s.*), sum(s.input_tokens + s.output_tokens),
                  count(*) FILTER (WHERE s.kind = 'MODEL'), max(s.attempts)
           FROM run r JOIN run_step s ON s.run_id = r.id GROUP BY r.id"""
    )
    rows = await cur.fetchall()
    assert len(rows) == 50
    for run_id, tokens, claims, steps, step_tokens, model_steps, attempts in rows:
        assert steps == 5 and model_steps == 3 and attempts == 1 and claims == 1, run_id
        assert tokens == step_tokens == 30
    assert llm.calls == 150
    cur = await db.execute("SELECT count(DISTINCT locked_by) FROM run")
    assert (await cur.fetchone())[0] >= 2  # type: ignore[index]  # the work was shared
