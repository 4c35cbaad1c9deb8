"""Faults against real PostgreSQL and the real worker loop: dropped connections, a database restart,
a stolen lease, a model that stays overloaded, tools that hang or say too much."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import threading
import uuid
from typing import Any

import httpx
import psycopg
import pytest

from agentrun.worker.core.records import ModelTurn, RunStatus, StepStatus
from agentrun.worker.core.types import Usage
from agentrun.worker.llm.anthropic_client import AnthropicClient
from agentrun.worker.llm.factory import LlmSettings, build_llm
from agentrun.worker.llm.retry import Retrying
from agentrun.worker.llm.timeout import TimeLimited
from agentrun.worker.runtime.runner import Worker
from agentrun.worker.store import LIVENESS_LOCK_CLASS, RunStore, migrate
from agentrun.worker.store.groupcommit import GroupCommit
from agentrun.worker.store.pool import open_pool
from agentrun.worker.testing.fake_server import FakeAnthropic, Reply
from agentrun.worker.testing.scripted import ScriptedLlm
from agentrun.worker.tools import ToolContext, tool
from bench.local_postgres import LocalPostgres
from tests.support.builders import http_app, new_run, worker
from tests.support.running import finished
from tests.support.running import running as serving
from tests.support.waiting import eventually


async def assert_whole(store: RunStore, run_id: uuid.UUID) -> None:
    """Never half-written: no step left STARTED, and the counters are the sum of the steps."""
    run = await store.get(run_id)
    steps = await store.steps(run_id)
    assert run is not None
    assert [s.seq for s in steps] == list(range(1, len(steps) + 1))
    assert all(s.status is not StepStatus.STARTED for s in steps)
    assert run.tokens_used == sum(
        s.input_tokens + s.output_tokens + s.cache_creation_input_tokens + s.cache_read_input_tokens for s in steps
    )


# -- a checkpoint is all or nothing ----------------------------------------------------------------

ARM = """
CREATE TABLE IF NOT EXISTS test_fault (run_id uuid PRIMARY KEY);
CREATE OR REPLACE FUNCTION test_fault_counters() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM test_fault WHERE run_id = NEW.id) THEN
        RAISE EXCEPTION 'injected fault: the run''s counters cannot be written';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER test_fault_counters BEFORE UPDATE OF tokens_used, cost_usd ON run
    FOR EACH ROW WHEN (NEW.tokens_used IS DISTINCT FROM OLD.tokens_used) EXECUTE FUNCTION test_fault_counters();
"""


@pytest.mark.parametrize("batched", [False, True], ids=["alone", "in-a-batch"])
async def test_a_fault_writing_the_counters_leaves_no_step_row(
    store: RunStore, db: psycopg.AsyncConnection[Any], batched: bool
) -> None:
    """The step row and the run's counters are one write: a fault on the counters (here a trigger that
    raises) leaves no step row behind either, so the counters stay the sums of the steps. Written as two
    statements, the step row would commit and the counters lag it for good."""
    await db.execute(ARM)
    for _ in range(3):
        await store.create(new_run())
    claims = await store.claim_many("w", 30, limit=3)
    faulty, *fine = [c.run.id for c in claims]
    await db.execute("INSERT INTO test_fault VALUES (%s)", (faulty,))
    writer = RunStore(store.pool, GroupCommit(store.pool, senders=1)) if batched else store
    turn = ModelTurn("{}", '[{"type":"text","text":"x"}]', "end_turn", Usage(10, 5, 0, 0), None, 0)
    answers = await asyncio.gather(*(writer.checkpoint_model(i, "w", 30, turn) for i in (faulty, *(fine if batched else []))),
                                   return_exceptions=True)
    assert isinstance(answers[0], psycopg.Error) and "injected fault" in str(answers[0]), answers
    assert await store.steps(faulty) == []
    after = await store.get(faulty)
    assert after is not None and (after.tokens_used, after.cost_usd) == (0, 0)
    await db.execute("DELETE FROM test_fault")
    seq, progress = await store.checkpoint_model(faulty, "w", 30, turn)  # the same step, written whole
    assert (seq, progress.tokens_used) == (1, 15)
    for run_id in (faulty, *(fine if batched else [])):
        await assert_whole(store, run_id)
        assert len(await store.steps(run_id)) == 1


# -- the database goes away ----------------------------------------------------------------------


async def test_dropped_connections_mid_step_hand_the_run_back_and_it_finishes(
    store: RunStore, db: psycopg.AsyncConnection[Any]
) -> None:
    llm = ScriptedLlm().then_tool_use("toolu_1", "lookup", {}, 10, 5).then_text("done", 10, 5)
    keys: list[str] = []

    @tool(name="lookup")
    async def lookup(args: dict[str, Any], ctx: ToolContext) -> str:
        keys.append(ctx.idempotency_key)
        if len(keys) == 1:  # every connection of the worker's pool dies while the tool runs
            await db.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        return "found"

    run, _ = await store.create(new_run())
    async with serving(worker(store, llm, [lookup], lease=1.0)):
        after = await finished(store, run.id)
    assert after.status is RunStatus.SUCCEEDED, after.error
    await assert_whole(store, run.id)
    assert len(llm.seen) == 2  # the model step before the fault was not repeated
    # The tool's finish could not be written: the step was redone under the same key, counted.
    tool_step = [s for s in await store.steps(run.id) if s.tool_use_id == "toolu_1"]
    assert len(tool_step) == 1 and tool_step[0].attempts == len(keys) and set(keys) == {"toolu_1"}


async def test_database_restart_mid_step_readyz_and_recovery() -> None:
    pg = await asyncio.to_thread(LocalPostgres)
    try:
        await migrate.migrate(pg.url)
        pool = await open_pool(pg.url, max_size=6, timeout=5)
        store = RunStore(pool)
        app = http_app(store)
        started, go_on = asyncio.Event(), asyncio.Event()
        keys: list[str] = []

        @tool(name="slow")
        async def slow(args: dict[str, Any], ctx: ToolContext) -> str:
            keys.append(ctx.idempotency_key)
            started.set()
            await go_on.wait()
            return "slow result"

        async def readyz() -> int:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://w") as c:
                return (await c.get("/readyz")).status_code

        llm = ScriptedLlm().then_tool_use("toolu_s", "slow", {}, 10, 5).then_text("done", 10, 5)
        run, _ = await store.create(new_run())
        assert await readyz() == 200
        # A lease of 3 s (renewals bounded at 0.3 s): on a loaded machine a shorter one is given up for
        # slow renewals alone once the database is back, and the model call after the tool is paid twice.
        async with serving(worker(store, llm, [slow], lease=3.0)):
            await asyncio.wait_for(started.wait(), 20)
            await asyncio.to_thread(pg.stop)  # the database crashes while the tool runs
            assert await readyz() == 503
            await asyncio.to_thread(pg.start)
            go_on.set()

            async def ready() -> bool:
                return await readyz() == 200

            await eventually(ready, 30, "readyz to be ready again")
            after = await finished(store, run.id)
        assert after.status is RunStatus.SUCCEEDED, after.error
        await assert_whole(store, run.id)
        assert len(llm.seen) == 2
        steps = await store.steps(run.id)
        assert [s.tool_use_id for s in steps if s.tool_use_id] == ["toolu_s"]
        assert set(keys) == {"toolu_s"} and steps[1].attempts >= len(keys)
        await pool.close()
    finally:
        await asyncio.to_thread(pg.close)


# -- the lease is taken while a slow tool runs ---------------------------------------------------


async def steal(db: psycopg.AsyncConnection[Any], run_id: uuid.UUID) -> None:
    """What a claim by a live worker-B does to the row, with a lease that will not lapse during the test.

    worker-B's liveness lock is held on `db` for the rest of the test, as a live worker holds it, so
    worker-A cannot see worker-B as dead and claim the run straight back.
    """
    await db.execute("SELECT pg_advisory_lock(%s, hashtext('worker-B'))", (LIVENESS_LOCK_CLASS,))
    await db.execute(
        "UPDATE run SET locked_by = 'worker-B', locked_until = now() + interval '1 hour', claims = claims + 1 "
        "WHERE id = %s",
        (run_id,),
    )


def lease_lost_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if "lease lost" in r.getMessage()]


async def test_stale_worker_finish_is_fenced_and_logged_once(
    store: RunStore, db: psycopg.AsyncConnection[Any], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    started, go_on = asyncio.Event(), asyncio.Event()

    @tool(name="slow")
    async def slow(args: dict[str, Any], ctx: ToolContext) -> str:
        started.set()
        await go_on.wait()
        return "late result"

    llm = ScriptedLlm().then_tool_use("toolu_1", "slow", {}, 10, 5).then_text("never asked")
    run, _ = await store.create(new_run())
    # A 30 s lease: the heartbeat does not beat during the test, so the fenced write is what notices.
    a = worker(store, llm, [slow], name="worker-A", lease=30.0)
    async with serving(a):
        await asyncio.wait_for(started.wait(), 10)
        await steal(db, run.id)
        go_on.set()

        async def a_let_go() -> bool:
            return not a.in_flight

        await eventually(a_let_go, 10, "worker-A to stop driving the run")
    assert len(lease_lost_lines(caplog)) == 1
    steps = await store.steps(run.id)
    # The finish was refused: the step is as worker-A started it, and worker-A asked the model nothing more.
    assert steps[-1].status is StepStatus.STARTED and steps[-1].response is None
    assert len(llm.seen) == 1
    after = await store.get(run.id)
    assert after is not None and after.status is RunStatus.RUNNING and after.locked_by == "worker-B"


async def test_heartbeat_notices_the_stolen_lease_and_cancels_the_tool(
    store: RunStore, db: psycopg.AsyncConnection[Any], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    started, cancelled = asyncio.Event(), asyncio.Event()

    @tool(name="slow")
    async def slow(args: dict[str, Any], ctx: ToolContext) -> str:
        started.set()
        try:
            await asyncio.Event().wait()  # never ends by itself
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "unreachable"

    llm = ScriptedLlm().then_tool_use("toolu_1", "slow", {}, 10, 5)
    run, _ = await store.create(new_run())
    a = worker(store, llm, [slow], name="worker-A", lease=0.9)  # beats every 0.3 s
    async with serving(a):
        await asyncio.wait_for(started.wait(), 10)
        await steal(db, run.id)
        await asyncio.wait_for(cancelled.wait(), 10)

        async def a_let_go() -> bool:
            return not a.in_flight

        await eventually(a_let_go, 10, "worker-A to stop driving the run")
    assert len(lease_lost_lines(caplog)) == 1
    assert (await store.steps(run.id))[-1].status is StepStatus.STARTED


# -- the model API stays down ---------------------------------------------------------------------


def _quick_outage_backoff(w: Worker, base: float = 0.2, cap: float = 0.4) -> Worker:
    w.driver.settings = dataclasses.replace(w.driver.settings, outage_backoff_base=base, outage_backoff_cap=cap)
    return w


async def test_an_outage_longer_than_the_retries_hands_the_run_back_and_it_succeeds_after(store: RunStore) -> None:
    """Every attempt of a step fails retryably: the run is not failed but handed back with backoff,
    tried again later, and once the API answers it succeeds, paying only for the calls that answered."""
    down = {"calls": 12}

    def api_reply(body: dict[str, Any]) -> Reply:
        if down["calls"] > 0:
            down["calls"] -= 1
            return Reply.overloaded()
        return Reply.text("recovered", {"input_tokens": 10, "output_tokens": 5})

    async with FakeAnthropic(api_reply) as api:
        llm = build_llm(LlmSettings(max_attempts=4, backoff_base_seconds=0.01, backoff_cap_seconds=0.02),
                        api_key="test-key", base_url=api.base_url)
        run, _ = await store.create(new_run())
        async with serving(_quick_outage_backoff(worker(store, llm, []))):
            after = await finished(store, run.id)
        assert after.status is RunStatus.SUCCEEDED, after.error
        assert len(api.requests) == 13  # three rounds of four attempts, handed back between, then the answer
        steps = await store.steps(run.id)
        assert len(steps) == 1 and after.tokens_used == 15
        assert after.crashes == 0 and after.model_retries == 0  # handed back, not crashed; reset by the answer


async def test_a_run_handed_back_in_an_outage_waits_its_backoff(
    store: RunStore, db: psycopg.AsyncConnection[Any]
) -> None:
    async with FakeAnthropic(lambda body: Reply.overloaded()) as api:
        llm = build_llm(LlmSettings(max_attempts=2, backoff_base_seconds=0.01, backoff_cap_seconds=0.02),
                        api_key="test-key", base_url=api.base_url)
        run, _ = await store.create(new_run())
        w = _quick_outage_backoff(worker(store, llm, []), base=600, cap=600)
        async with serving(w):
            async def handed_back() -> bool:
                r = await store.get(run.id)
                return r is not None and r.model_retries == 1

            await eventually(handed_back, 20, "the run to be handed back")
            cur = await db.execute(
                "SELECT extract(epoch FROM run_at - now()), status, handed_back, locked_by FROM run WHERE id = %s",
                (run.id,),
            )
            wait, status, back, holder = await cur.fetchone()  # type: ignore[misc]
        # Not failed: queued again with no holder, claimable after the backoff.
        assert status == "QUEUED" and back and holder is None
        assert 250 < float(wait) <= 600  # equal jitter: at least half of base × 2^0
        assert len(api.requests) == 2  # nothing more while it waits: no hot loop


async def test_a_non_retryable_model_error_fails_the_run_at_once(store: RunStore) -> None:
    async with FakeAnthropic(lambda body: Reply.error(400, "bad request", "invalid_request_error")) as api:
        llm = build_llm(LlmSettings(max_attempts=4, backoff_base_seconds=0.01, backoff_cap_seconds=0.02),
                        api_key="test-key", base_url=api.base_url)
        run, _ = await store.create(new_run())
        async with serving(worker(store, llm, [])):
            after = await finished(store, run.id)
        assert after.status is RunStatus.FAILED and after.error is not None and "400" in after.error
        assert len(api.requests) == 1 and after.tokens_used == 0


async def test_model_overloaded_past_the_deadline_times_out_backing_off(store: RunStore) -> None:
    async with FakeAnthropic(lambda body: Reply.overloaded()) as api:
        client = AnthropicClient(api_key="test-key", base_url=api.base_url, http_timeout=10)
        # As good as unlimited attempts; a seeded jitter makes the waits the same every time.
        llm = Retrying(TimeLimited(client, 5), max_attempts=1_000_000, base=0.05, cap=0.2, rng=random.Random(7))
        run, _ = await store.create(new_run(timeout_seconds=1))
        async with serving(worker(store, llm, [])):
            after = await finished(store, run.id)
        assert after.status is RunStatus.TIMED_OUT and after.error is not None and "deadline" in after.error
        # Backing off between 0 and 0.2 s: tens of calls in a second, where a hot loop makes thousands.
        assert 2 <= len(api.requests) < 100


# -- tools that misbehave ---------------------------------------------------------------------------


async def test_tools_hanging_past_their_timeout_become_errors_for_the_model(store: RunStore) -> None:
    unblock = threading.Event()

    @tool(name="hangs_async", timeout_seconds=0.2)
    async def hangs_async(args: dict[str, Any], ctx: ToolContext) -> str:
        await asyncio.Event().wait()
        return "unreachable"

    @tool(name="hangs_sync", timeout_seconds=0.2)
    def hangs_sync(args: dict[str, Any], ctx: ToolContext) -> str:
        unblock.wait(30)
        return "too late"

    llm = ScriptedLlm().then_tool_uses([("t1", "hangs_async", {}), ("t2", "hangs_sync", {})]).then_text("ok")
    run, _ = await store.create(new_run())
    try:
        async with serving(worker(store, llm, [hangs_async, hangs_sync])):
            after = await finished(store, run.id)
    finally:
        unblock.set()
    assert after.status is RunStatus.SUCCEEDED
    tools = [s for s in await store.steps(run.id) if s.tool_use_id]
    assert [(s.status, s.response) for s in tools] == [
        (StepStatus.ERROR, "error: tool hangs_async timed out after 0.2s"),
        (StepStatus.ERROR, "error: tool hangs_sync timed out after 0.2s"),
    ]
    results = llm.seen[1].messages[-1]["content"]
    assert all(r["is_error"] for r in results)


async def test_huge_tool_output_is_capped_and_says_so(store: RunStore) -> None:
    @tool(name="firehose")
    async def firehose(args: dict[str, Any], ctx: ToolContext) -> str:
        return "x" * 2_000_000

    llm = ScriptedLlm().then_tool_use("t1", "firehose", {}).then_text("ok")
    run, _ = await store.create(new_run())
    async with serving(worker(store, llm, [firehose])):
        after = await finished(store, run.id)
    assert after.status is RunStatus.SUCCEEDED
    step = (await store.steps(run.id))[1]
    assert step.response is not None
    assert step.response == "x" * 100_000 + "\n[output truncated: 1900000 more characters not shown]"
    assert llm.seen[1].messages[-1]["content"][0]["content"] == step.response  # the model is told too
