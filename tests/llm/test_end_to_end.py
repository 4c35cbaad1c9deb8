"""Runs driven by the engine through Retrying(TimeLimited(AnthropicClient)) against the fake Messages API."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any

import pytest

from agentrun.worker.core.records import RunStatus, StepKind
from agentrun.worker.llm.anthropic_client import AnthropicClient
from agentrun.worker.llm.retry import Retrying
from agentrun.worker.llm.timeout import TimeLimited
from agentrun.worker.store import RunStore
from agentrun.worker.testing.fake_server import FakeAnthropic, Reply, usage_of
from agentrun.worker.tools import ToolContext, tool
from tests.support.builders import new_run, worker
from tests.support.llm import RecordingSleeper

EPHEMERAL = {"type": "ephemeral"}


@tool(name="list_tickets", description="List support tickets by status.",
      input_schema={"type": "object", "properties": {"status": {"type": "string"}}})
def list_tickets(args: dict[str, Any], ctx: ToolContext) -> str:
    return f"{args.get('status', 'any')} tickets: T-1 printer jam, T-2 VPN down"


@tool(name="page_oncall", description="Page the on-call engineer.")
async def page_oncall(args: dict[str, Any], ctx: ToolContext) -> str:
    return f"paged (key {ctx.idempotency_key})"


@pytest.fixture
async def llm(fake: FakeAnthropic, sleeper: RecordingSleeper) -> AsyncIterator[Retrying]:
    client = AnthropicClient(api_key="test-key", base_url=fake.base_url, http_timeout=10.0)
    try:
        yield Retrying(TimeLimited(client, 5.0), max_attempts=4, base=0.1, cap=1.0, sleeper=sleeper)
    finally:
        await client.aclose()


async def test_a_run_completes_with_cache_tokens_and_cost_stored(
    store: RunStore, fake: FakeAnthropic, llm: Retrying, sleeper: RecordingSleeper
) -> None:
    fake.script(
        Reply.overloaded(),  # retried, invisible to the run
        Reply.tool_use("list_tickets", {"status": "open"}, id="toolu_a", usage=usage_of(12, 30, cache_write=2000)),
        Reply.message(
            [{"type": "text", "text": "Paging twice."},
             {"type": "tool_use", "id": "toolu_b", "name": "page_oncall", "input": {}},
             {"type": "tool_use", "id": "toolu_c", "name": "page_oncall", "input": {}}],
            "tool_use", usage_of(8, 40, cache_write=150, cache_read=2000),
        ),
        Reply.text("T-1 and T-2 are open; on-call paged.", usage_of(5, 20, cache_write=120, cache_read=2150)),
    )
    run, _ = await store.create(new_run("What is open?", system="You triage tickets."))

    await worker(store, llm, [list_tickets, page_oncall]).run_once()

    done = await store.get(run.id)
    assert done is not None and done.status is RunStatus.SUCCEEDED, done.error if done else None
    assert len(fake.requests) == 4 and len(sleeper.waits) == 1

    models = [s for s in await store.timeline(run.id) if s.kind is StepKind.MODEL]
    assert [(s.cache_creation_input_tokens, s.cache_read_input_tokens) for s in models] == [(2000, 0), (150, 2000), (120, 2150)]
    assert all(s.cost_usd is not None and s.cost_usd > 0 for s in models)
    assert done.cost_usd == sum(s.cost_usd for s in models if s.cost_usd is not None)
    # sonnet: 3 in, 15 out, 3.75 cache write, 0.30 cache read, per million tokens
    assert str(models[0].cost_usd) == "0.007986"  # (12*3 + 30*15 + 2000*3.75) / 1e6
    assert done.tokens_used == (12 + 30 + 2000) + (8 + 40 + 150 + 2000) + (5 + 20 + 120 + 2150)

    # What the API received: the system prefix cached, tools defined, every tool_result of a turn in
    # ONE user message right after its tool_use, and a breakpoint on the newest message.
    for body in fake.requests:
        assert body["system"] == [{"type": "text", "text": "You triage tickets.", "cache_control": EPHEMERAL}]
        assert [t["name"] for t in body["tools"]] == ["list_tickets", "page_oncall"]
        assert body["messages"][-1]["content"][-1]["cache_control"] == EPHEMERAL
        assert json.dumps(body).count('"cache_control"') <= 4
    last = fake.requests[-1]["messages"]
    assert [m["role"] for m in last] == ["user", "assistant", "user", "assistant", "user"]
    assert last[3]["content"][1:] == [
        {"type": "tool_use", "id": "toolu_b", "name": "page_oncall", "input": {}},
        {"type": "tool_use", "id": "toolu_c", "name": "page_oncall", "input": {}},
    ]
    results = last[4]["content"]
    assert [(b["type"], b["tool_use_id"]) for b in results] == [("tool_result", "toolu_b"), ("tool_result", "toolu_c")]
    assert results[0]["content"] == "paged (key toolu_b)"
    assert last[2]["content"][0]["content"] == "open tickets: T-1 printer jam, T-2 VPN down"


async def test_the_default_agent_mode_drives_a_run_to_the_end(store: RunStore, fake: FakeAnthropic, llm: Retrying) -> None:
    run, _ = await store.create(new_run("Summarise the open tickets."))

    await worker(store, llm, [list_tickets]).run_once()

    done = await store.get(run.id)
    assert done is not None and done.status is RunStatus.SUCCEEDED, done.error
    steps = await store.steps(run.id)
    assert [s.kind for s in steps] == [StepKind.MODEL, StepKind.TOOL, StepKind.MODEL]
    assert "T-1 printer jam" in (steps[-1].response or "")
    assert steps[-1].cache_read_input_tokens > 0 and done.cost_usd > 0


async def test_a_400_fails_the_run_with_the_api_message(
    store: RunStore, fake: FakeAnthropic, llm: Retrying, sleeper: RecordingSleeper
) -> None:
    fake.script(Reply.bad_request("messages.0.content: prompt is too long: 210000 tokens > 200000 maximum"))
    run, _ = await store.create(new_run("What is open?"))

    await worker(store, llm, [list_tickets]).run_once()

    done = await store.get(run.id)
    assert done is not None and done.status is RunStatus.FAILED
    assert done.error is not None and "prompt is too long: 210000 tokens > 200000 maximum" in done.error
    assert "Traceback" not in done.error
    assert len(fake.requests) == 1 and sleeper.waits == []
    assert await store.steps(run.id) == []


async def test_an_unknown_model_costs_null_and_the_run_still_completes(
    store: RunStore, fake: FakeAnthropic, llm: Retrying, caplog: pytest.LogCaptureFixture
) -> None:
    run, _ = await store.create(new_run("What is open?", model="claude-imaginary-9"))

    await worker(store, llm, [list_tickets]).run_once()

    done = await store.get(run.id)
    assert done is not None and done.status is RunStatus.SUCCEEDED
    assert all(s.cost_usd is None for s in await store.timeline(run.id) if s.kind is StepKind.MODEL)
    assert done.cost_usd == 0 and done.tokens_used > 0
    assert "no price for model claude-imaginary-9" in caplog.text


async def test_a_cost_budget_stops_the_run_before_the_next_model_step(store: RunStore, fake: FakeAnthropic, llm: Retrying) -> None:
    fake.script(Reply.tool_use("list_tickets", {}, id="toolu_a", usage=usage_of(10, 10, cache_write=100_000)))
    run, _ = await store.create(new_run("What is open?", token_budget=1_000_000, cost_budget_usd=Decimal("0.10")))

    await worker(store, llm, [list_tickets]).run_once()

    done = await store.get(run.id)
    assert done is not None and done.status is RunStatus.FAILED
    assert done.error is not None and done.error.startswith("cost budget exhausted")
    assert done.cost_usd == Decimal("0.375180")  # (10*3 + 10*15 + 100000*3.75) / 1e6, over the 0.10 budget
    assert len(fake.requests) == 1  # the tool ran, the second model call did not



async def test_a_tool_input_beyond_64_bits_fails_the_run_and_never_reaches_the_tool(
    store: RunStore, fake: FakeAnthropic, llm: Retrying
) -> None:
    """2**70 must not reach a tool as 1.18e21 (orjson's reading): the turn is refused, as replay refuses
    it. The engine streams every model call, so this is the streamed answer."""
    seen: list[Any] = []

    @tool(name="count", description="Count to n.")
    def count(args: dict[str, Any], ctx: ToolContext) -> str:
        seen.append(args)
        return "counted"

    fake.script(Reply.tool_use("count", {"n": 2**70}, id="toolu_n"), Reply.text("done"))
    run, _ = await store.create(new_run("Count."))

    await worker(store, llm, [count]).run_once()

    done = await store.get(run.id)
    assert seen == []
    assert done is not None and done.status is RunStatus.FAILED, done.status if done else None
    assert done.error is not None and "holds an integer beyond 64 bits" in done.error
    assert fake.requests[0].get("stream") is True
