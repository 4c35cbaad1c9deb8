"""The guard stops runaway runs, each with a reason; cancel works queued and running."""

from __future__ import annotations

import asyncio
import threading
import uuid
from decimal import Decimal
from typing import Any

import psycopg
import pytest

from agentrun.worker.core.records import RunStatus, StepStatus
from agentrun.worker.core.types import LlmError, LlmRequest, LlmResponse, Usage
from agentrun.worker.obs.metrics import Metrics
from agentrun.worker.store import RunStore
from agentrun.worker.testing.scripted import ScriptedLlm, TurnBasedLlm
from agentrun.worker.tools import ToolBox, ToolContext, ToolOutcome, ToolThreads, tool
from tests.support.builders import SimulatedCrash, new_run, worker
from tests.support.waiting import eventually


@tool(name="noop")
async def noop(args: dict[str, Any], ctx: ToolContext) -> str:
    return "ok"


async def finished(store: RunStore, run_id: uuid.UUID) -> tuple[RunStatus, str | None]:
    run = await store.get(run_id)
    assert run is not None
    return run.status, run.error


async def test_token_budget(store: RunStore) -> None:
    run, _ = await store.create(new_run(token_budget=100))
    await worker(store, TurnBasedLlm(turns=10, in_=40, out=20), [noop]).run_once()
    status, error = await finished(store, run.id)
    assert status is RunStatus.FAILED and error == "token budget exhausted: used 120 of 100 tokens"


async def test_budget_overshoot_is_bounded_by_one_step_and_a_final_answer_is_kept(store: RunStore) -> None:
    run, _ = await store.create(new_run(token_budget=10))
    await worker(store, ScriptedLlm().then_text("expensive but done", 500, 500), [noop]).run_once()
    assert (await finished(store, run.id))[0] is RunStatus.SUCCEEDED


async def test_cost_budget(store: RunStore) -> None:
    run, _ = await store.create(new_run(cost_budget_usd=Decimal("0.001")))
    # claude-sonnet-4-5: $3/M input → 1000 input tokens cost $0.003 in one step.
    await worker(store, TurnBasedLlm(turns=10, in_=1000, out=0), [noop]).run_once()
    status, error = await finished(store, run.id)
    assert status is RunStatus.FAILED and error is not None and error.startswith("cost budget exhausted")
    after = await store.get(run.id)
    assert after is not None and after.cost_usd == Decimal("0.003")


async def test_a_run_at_exactly_its_token_budget_stops(store: RunStore) -> None:
    """The budget is the most a run may use: at it, no further model call (`>=`, not `>`)."""
    run, _ = await store.create(new_run(token_budget=120))
    llm = TurnBasedLlm(turns=10, in_=40, out=20)
    await worker(store, llm, [noop]).run_once()
    status, error = await finished(store, run.id)
    assert status is RunStatus.FAILED and error == "token budget exhausted: used 120 of 120 tokens"
    assert llm.calls == 2
    below, _ = await store.create(new_run(token_budget=121))  # one token left: one more model call
    llm = TurnBasedLlm(turns=10, in_=40, out=20)
    await worker(store, llm, [noop]).run_once()
    assert await finished(store, below.id) == (RunStatus.FAILED, "token budget exhausted: used 180 of 121 tokens")
    assert llm.calls == 3


async def test_a_run_at_exactly_its_cost_budget_stops(store: RunStore) -> None:
    # claude-sonnet-4-5: $3/M input → 1000 input tokens cost exactly $0.003 a step.
    run, _ = await store.create(new_run(cost_budget_usd=Decimal("0.006")))
    llm = TurnBasedLlm(turns=10, in_=1000, out=0)
    await worker(store, llm, [noop]).run_once()
    status, error = await finished(store, run.id)
    assert status is RunStatus.FAILED and error == "cost budget exhausted: spent $0.0060 of $0.0060"
    assert llm.calls == 2
    below, _ = await store.create(new_run(cost_budget_usd=Decimal("0.006001")))
    llm = TurnBasedLlm(turns=10, in_=1000, out=0)
    await worker(store, llm, [noop]).run_once()
    assert (await finished(store, below.id))[0] is RunStatus.FAILED and llm.calls == 3


async def test_step_cap(store: RunStore) -> None:
    run, _ = await store.create(new_run(max_steps=4))
    await worker(store, TurnBasedLlm(turns=100), [noop]).run_once()
    status, error = await finished(store, run.id)
    assert status is RunStatus.FAILED and error == "step cap reached: 4 steps of at most 4"


async def test_deadline_passed_before_claim(store: RunStore, db: psycopg.AsyncConnection[Any]) -> None:
    run, _ = await store.create(new_run())
    await db.execute("UPDATE run SET deadline_at = now() - interval '1 second' WHERE id = %s", (run.id,))
    llm = TurnBasedLlm(turns=1)
    await worker(store, llm, [noop]).run_once()
    status, error = await finished(store, run.id)
    assert status is RunStatus.TIMED_OUT and error is not None and "deadline" in error
    assert llm.calls == 0


async def test_deadline_passing_during_a_step_ends_the_run(store: RunStore, db: psycopg.AsyncConnection[Any]) -> None:
    # The deadline is made to fall one second after the claim, whenever the claim comes: a run created
    # with a one-second timeout on a loaded machine may be claimed after its deadline and end TIMED_OUT
    # by the guard, before any step, which is not what this test is about. From the claim, the worker
    # reads the steps, sets its deadline timer and calls the model; that call is the first point where
    # the timer can fire, so the deadline passes during the model step however slow the machine.
    await db.execute("""
        CREATE FUNCTION deadline_after_claim() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN NEW.deadline_at := now() + interval '1 second'; RETURN NEW; END $$;
        CREATE TRIGGER deadline_after_claim BEFORE UPDATE ON run FOR EACH ROW
            WHEN (OLD.status = 'QUEUED' AND NEW.status = 'RUNNING') EXECUTE FUNCTION deadline_after_claim();
    """)
    run, _ = await store.create(new_run(timeout_seconds=300))
    calls: list[str] = []

    class Forever(ScriptedLlm):
        async def send(self, request: Any) -> Any:
            calls.append("started")
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                calls.append("cancelled")
                raise
            return await super().send(request)

    try:
        async with asyncio.timeout(120):  # a generous bound, so a deadline that never fires fails, not hangs
            await worker(store, Forever(), [noop]).run_once()
    except TimeoutError:
        raise AssertionError(f"the deadline never interrupted the model call: {calls}") from None
    status, error = await finished(store, run.id)
    assert status is RunStatus.TIMED_OUT and error == "deadline passed: the run may take 300s"
    assert calls == ["started", "cancelled"], "the deadline did not interrupt the model call in flight"
    assert await store.steps(run.id) == []  # the interrupted call wrote no step


async def test_cancel_queued_run_ends_at_once(store: RunStore) -> None:
    run, _ = await store.create(new_run())
    after = await store.cancel(run.id)
    assert after is not None and after.status is RunStatus.CANCELLED and after.finished_at is not None
    assert await worker(store, TurnBasedLlm(1), [noop]).run_once() is None  # nothing left to claim
    again = await store.cancel(run.id)
    assert again is not None and again.status is RunStatus.CANCELLED  # finished runs stay as they are
    assert await store.cancel(uuid.uuid4()) is None


async def test_cancel_running_run_stops_at_next_guard(store: RunStore) -> None:
    run, _ = await store.create(new_run())

    @tool(name="cancel_me")
    async def cancel_me(args: dict[str, Any], ctx: ToolContext) -> str:
        await store.cancel(ctx.run_id)
        return "ok"

    llm = ScriptedLlm().then_tool_use("t1", "cancel_me").then_text("never asked")
    await worker(store, llm, [cancel_me]).run_once()
    status, error = await finished(store, run.id)
    assert status is RunStatus.CANCELLED and error == "cancel requested"
    assert len(llm.seen) == 1


async def test_non_idempotent_tool_in_doubt_waits_for_a_human(store: RunStore, db: psycopg.AsyncConnection[Any]) -> None:
    run, _ = await store.create(new_run())
    charged: list[str] = []

    @tool(name="charge_card", idempotent=False)
    async def charge_card(args: dict[str, Any], ctx: ToolContext) -> str:
        charged.append(ctx.tool_use_id)
        raise SimulatedCrash()

    llm = ScriptedLlm().then_tool_use("toolu_pay", "charge_card", {"usd": 10})
    with pytest.raises(SimulatedCrash):
        await worker(store, llm, [charge_card], "worker-A").run_once()
    await db.execute("UPDATE run SET locked_until = now() - interval '1 second' WHERE id = %s", (run.id,))
    await worker(store, llm, [charge_card], "worker-B").run_once()
    after = await store.get(run.id)
    assert after is not None and after.status is RunStatus.WAITING and after.pending == 1
    [call] = await store.decisions(run.id)
    assert (call.tool_use_id, call.tool_name, call.kind.value, call.decision) == ("toolu_pay", "charge_card",
                                                                                  "in_doubt", None)
    assert charged == ["toolu_pay"]  # not run a second time
    steps = await store.steps(run.id)
    assert steps[-1].status.value == "STARTED"  # the evidence stays
    steps = await store.timeline(run.id)
    assert steps[-1].status is StepStatus.STARTED  # the evidence stays


async def test_model_error_fails_the_run_with_the_api_message(store: RunStore) -> None:
    run, _ = await store.create(new_run())
    llm = ScriptedLlm().then_fail(LlmError(400, None, "messages: roles must alternate"))
    await worker(store, llm, [noop]).run_once()
    status, error = await finished(store, run.id)
    assert status is RunStatus.FAILED and error == "model error 400: messages: roles must alternate"


async def test_tool_failures_are_information_for_the_model(store: RunStore) -> None:
    @tool(name="broken", input_schema={"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})
    async def broken(args: dict[str, Any], ctx: ToolContext) -> str:
        raise ValueError("no such ticket")

    @tool(name="sleepy", timeout_seconds=0.05)
    async def sleepy(args: dict[str, Any], ctx: ToolContext) -> str:
        await asyncio.sleep(10)
        return "late"

    run, _ = await store.create(new_run())
    llm = (
        ScriptedLlm()
        .then_tool_uses([("a", "broken", {"n": 1}), ("b", "broken", {"n": "x"}), ("c", "sleepy", {}), ("d", "nope", {})])
        .then_text("understood")
    )
    await worker(store, llm, [broken, sleepy]).run_once()
    assert (await finished(store, run.id))[0] is RunStatus.SUCCEEDED
    results = {b["tool_use_id"]: b for b in llm.seen[1].messages[-1]["content"]}
    assert results["a"]["content"] == "error: ValueError: no such ticket" and results["a"]["is_error"]
    assert "invalid input for broken" in results["b"]["content"]
    assert results["c"]["content"] == "error: tool sleepy timed out after 0.05s"
    assert results["d"]["content"] == "error: unknown tool 'nope'"
    assert all(r["is_error"] for r in results.values())


async def test_run_limited_to_its_tools(store: RunStore) -> None:
    @tool(name="secret")
    async def secret(args: dict[str, Any], ctx: ToolContext) -> str:
        return "leaked"

    run, _ = await store.create(new_run(tools=("noop",)))
    llm = ScriptedLlm().then_tool_use("t1", "secret").then_text("ok")
    await worker(store, llm, [noop, secret]).run_once()
    assert [t["name"] for t in llm.seen[0].tools] == ["noop"]
    assert llm.seen[1].messages[-1]["content"][0]["content"] == "error: unknown tool 'secret'"


async def test_huge_tool_output_is_capped_and_says_so(store: RunStore) -> None:
    @tool(name="flood")
    async def flood(args: dict[str, Any], ctx: ToolContext) -> str:
        return "x" * 250_000

    run, _ = await store.create(new_run())
    llm = ScriptedLlm().then_tool_use("t1", "flood").then_text("ok")
    await worker(store, llm, [flood]).run_once()
    content = llm.seen[1].messages[-1]["content"][0]["content"]
    assert len(content) < 100_100 and content.endswith("[output truncated: 150000 more characters not shown]")


async def test_a_callable_object_with_async_call_is_awaited(store: RunStore) -> None:
    class Lookup:
        async def __call__(self, args: dict[str, Any], ctx: ToolContext) -> str:
            await asyncio.sleep(0)
            return f"found {args['q']}"

    lookup = tool(name="lookup")(Lookup())
    assert lookup.is_async
    run, _ = await store.create(new_run())
    llm = ScriptedLlm().then_tool_use("t1", "lookup", {"q": "x"}).then_text("ok")
    await worker(store, llm, [lookup]).run_once()
    assert llm.seen[1].messages[-1]["content"][0] == {"type": "tool_result", "tool_use_id": "t1", "content": "found x"}


@pytest.mark.parametrize(
    ("stop_reason", "status", "reason"),
    [
        ("end_turn", RunStatus.SUCCEEDED, None),
        ("stop_sequence", RunStatus.SUCCEEDED, None),
        ("max_tokens", RunStatus.FAILED, "the model's answer was cut off at max_tokens=4096"),
        ("refusal", RunStatus.FAILED, "the model declined to answer (stop_reason refusal)"),
        ("model_context_window_exceeded", RunStatus.FAILED, "the conversation outgrew the model's context window"),
    ],
)
async def test_how_the_model_stops_decides_how_the_run_ends(
    store: RunStore, stop_reason: str, status: RunStatus, reason: str | None
) -> None:
    run, _ = await store.create(new_run())
    answer = LlmResponse([{"type": "text", "text": "partial"}], stop_reason, Usage(5, 5))
    await worker(store, ScriptedLlm().then_response(answer), [noop]).run_once()
    assert await finished(store, run.id) == (status, reason)


# -- the step cap is hard ------------------------------------------------------------------------------


def counting_tool(calls: list[str]) -> Any:
    @tool(name="noop")
    async def counted(args: dict[str, Any], ctx: ToolContext) -> str:
        calls.append(ctx.tool_use_id)
        return "ok"

    return counted


async def test_step_cap_is_never_exceeded_and_no_tool_runs_past_it(store: RunStore) -> None:
    calls: list[str] = []
    run, _ = await store.create(new_run(max_steps=5))
    await worker(store, TurnBasedLlm(turns=100), [counting_tool(calls)]).run_once()
    status, error = await finished(store, run.id)
    steps = await store.steps(run.id)
    assert len(steps) == 5  # model, tool, model, tool, model: the fifth turn's tool would be step 6
    assert calls == ["toolu_0_0", "toolu_1_0"]
    assert status is RunStatus.FAILED
    assert error == (
        "step cap reached: the model asked for 1 tool call at step 5 of at most 5, more than the cap leaves; "
        "they were not run"
    )


async def test_a_turn_whose_tools_do_not_all_fit_runs_none_of_them(store: RunStore) -> None:
    calls: list[str] = []
    run, _ = await store.create(new_run(max_steps=2))  # one step left after the model's: two tools asked
    await worker(store, TurnBasedLlm(turns=100, tools_per_turn=2), [counting_tool(calls)]).run_once()
    status, error = await finished(store, run.id)
    assert status is RunStatus.FAILED and error is not None and "2 tool calls at step 1 of at most 2" in error
    assert calls == [] and len(await store.steps(run.id)) == 1


async def test_a_turn_that_fits_exactly_runs_and_its_answer_may_be_the_last_step(store: RunStore) -> None:
    calls: list[str] = []
    run, _ = await store.create(new_run(max_steps=4))
    await worker(store, TurnBasedLlm(turns=1, tools_per_turn=2), [counting_tool(calls)]).run_once()
    assert await finished(store, run.id) == (RunStatus.SUCCEEDED, None)
    assert calls == ["toolu_0_0", "toolu_0_1"] and len(await store.steps(run.id)) == 4


# -- how the model stops ------------------------------------------------------------------------------


async def test_a_reply_cut_off_at_max_tokens_never_runs_its_tool_calls(store: RunStore) -> None:
    calls: list[str] = []
    run, _ = await store.create(new_run())
    cut = LlmResponse(
        [{"type": "text", "text": "Let me look"}, {"type": "tool_use", "id": "t1", "name": "noop", "input": {"q": "ha"}}],
        "max_tokens", Usage(7, 4096),
    )
    await worker(store, ScriptedLlm().then_response(cut), [counting_tool(calls)]).run_once()
    assert await finished(store, run.id) == (
        RunStatus.FAILED, "the model's answer was cut off at max_tokens=4096; its tool call was not run"
    )
    assert calls == []
    steps = await store.steps(run.id)
    assert len(steps) == 1 and steps[0].output_tokens == 4096


class CrashOnCall:
    """An LlmClient that answers from `inner` but crashes the worker on its `n`-th call."""

    def __init__(self, inner: ScriptedLlm, n: int) -> None:
        self.inner, self.n, self.calls = inner, n, 0

    async def send(self, request: LlmRequest) -> LlmResponse:
        self.calls += 1
        if self.calls == self.n:
            raise SimulatedCrash()
        return await self.inner.send(request)


PAUSED = [
    {"type": "text", "text": "Searching."},
    {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "x"}},
]


def paused_then_done() -> ScriptedLlm:
    return (
        ScriptedLlm()
        .then_response(LlmResponse(PAUSED, "pause_turn", Usage(10, 5)))
        .then_response(LlmResponse([{"type": "text", "text": "Found it."}], "end_turn", Usage(20, 3)))
    )


async def test_pause_turn_continues_the_turn_with_the_paused_content(store: RunStore) -> None:
    run, _ = await store.create(new_run())
    llm = paused_then_done()
    await worker(store, llm, [noop]).run_once()
    assert await finished(store, run.id) == (RunStatus.SUCCEEDED, None)
    assert len(llm.seen) == 2
    assert llm.seen[1].messages == [{"role": "user", "content": "find x"}, {"role": "assistant", "content": PAUSED}]
    after = await store.get(run.id)
    assert after is not None and after.tokens_used == 38


async def test_a_resumed_run_continues_a_paused_turn_the_same_way(
    store: RunStore, db: psycopg.AsyncConnection[Any]
) -> None:
    run, _ = await store.create(new_run())
    script = paused_then_done()
    with pytest.raises(SimulatedCrash):
        await worker(store, CrashOnCall(script, 2), [noop], "worker-A").run_once()
    await db.execute("UPDATE run SET locked_until = now() - interval '1 second' WHERE id = %s", (run.id,))
    await worker(store, script, [noop], "worker-B").run_once()
    assert await finished(store, run.id) == (RunStatus.SUCCEEDED, None)
    assert script.seen[-1].messages == [{"role": "user", "content": "find x"}, {"role": "assistant", "content": PAUSED}]


# -- synchronous tools: a bounded pool of their own, overruns visible ---------------------------------


async def test_a_timed_out_sync_tool_still_running_is_counted_and_keeps_its_slot(store: RunStore) -> None:
    release = threading.Event()
    started: list[str] = []

    @tool(name="stuck", timeout_seconds=0.05)
    def stuck(args: dict[str, Any], ctx: ToolContext) -> str:
        started.append(ctx.tool_use_id)
        release.wait(60)
        return "late"

    @tool(name="quick")
    def quick(args: dict[str, Any], ctx: ToolContext) -> str:
        started.append(ctx.tool_use_id)
        return "ok"

    box = ToolBox([stuck, quick], threads=ToolThreads(size=1))
    metrics = Metrics()
    metrics.watch_tool_threads(box.threads)
    run, _ = await store.create(new_run())
    llm = ScriptedLlm().then_tool_uses([("a", "stuck", {}), ("b", "quick", {})]).then_text("ok")
    try:
        await worker(store, llm, box, observer=metrics).run_once()
        results = {b["tool_use_id"]: b["content"] for b in llm.seen[1].messages[-1]["content"]}
        assert results == {
            "a": "error: tool stuck timed out after 0.05s",
            "b": "error: tool quick was not started: all 1 tool threads are busy (1 still running after their timeout)",
        }
        assert started == ["a"]  # the refused call never ran
        assert (box.threads.running, box.threads.overdue) == (1, 1)
        scrape = (await metrics.exposition()).decode()
        assert "agentrun_tool_threads_running 1.0" in scrape and "agentrun_tool_threads_overdue 1.0" in scrape
    finally:
        release.set()

    async def freed() -> bool:
        return (box.threads.running, box.threads.overdue) == (0, 0)

    await eventually(freed, what="the stuck thread to return")
    outcome = await box.execute("quick", {}, ToolContext(run.id, "c"))
    assert outcome == ToolOutcome(True, "ok") and started == ["a", "c"]


async def test_a_sync_call_whose_timeout_ran_out_before_its_thread_began_never_starts() -> None:
    started: list[str] = []
    now = [0.0]

    @tool(name="late", timeout_seconds=5)
    def late(args: dict[str, Any], ctx: ToolContext) -> str:
        started.append(ctx.tool_use_id)
        return "ran"

    def clock() -> float:
        # The caller reads the clock to set the deadline; by the time the thread reads it, time is up.
        value = now[0]
        now[0] += 10
        return value

    box = ToolBox([late], threads=ToolThreads(size=2, clock=clock))
    outcome = await box.execute("late", {}, ToolContext(uuid.uuid4(), "t1"))
    assert outcome == ToolOutcome(False, "error: tool late was not started: its 5s ran out first")
    assert started == [] and (box.threads.running, box.threads.overdue) == (0, 0)
    assert await box.execute("late", {}, ToolContext(uuid.uuid4(), "t2")) == ToolOutcome(
        False, "error: tool late was not started: its 5s ran out first"
    )  # the slot was given back each time
