"""Runs driven by the engine through Retrying(TimeLimited(ProviderRouter)) to an OpenAI-compatible endpoint
declared in a providers file, served by the local Chat Completions server through the real `openai` SDK."""

from __future__ import annotations

from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any

import psycopg
import pytest

from agentrun.worker.core.pricing import PriceTable
from agentrun.worker.core.records import RunStatus, StepKind
from agentrun.worker.llm.factory import LlmSettings, build_router
from agentrun.worker.llm.providers import Providers
from agentrun.worker.llm.retry import Retrying
from agentrun.worker.llm.timeout import TimeLimited
from agentrun.worker.store import RunStore
from agentrun.worker.testing.fake_openai_server import ChatAgentResponder, FakeOpenAi, bad_request, rate_limited
from agentrun.worker.tools import ToolContext, tool
from tests.support.builders import SimulatedCrash, new_run, worker
from tests.support.llm import RecordingSleeper

MODEL = "local/qwen3-8b"
PRICES = PriceTable.from_toml("""
[models."local/qwen3-8b"]
input = 0.20
output = 0.80
cache_write = 0
cache_read = 0.05
""")


@tool(name="list_tickets", description="List support tickets by status.",
      input_schema={"type": "object", "properties": {"status": {"type": "string"}, "part": {"type": "integer"}}})
def list_tickets(args: dict[str, Any], ctx: ToolContext) -> str:
    return f"part {args.get('part')}: {args.get('status')} tickets T-1, T-2 (key {ctx.idempotency_key})"


@pytest.fixture
async def chat() -> AsyncIterator[FakeOpenAi]:
    async with FakeOpenAi(ChatAgentResponder(parallel=2)) as server:
        yield server


@pytest.fixture
def llm(chat: FakeOpenAi, sleeper: RecordingSleeper) -> Retrying:
    providers = Providers.parse(f"""
providers:
  - name: local
    kind: openai
    baseUrl: {chat.v1_url}
    apiKeyEnv: LOCAL_API_KEY
    headers: {{X-Tenant: agentrun-tests}}
""")
    router = build_router(LlmSettings(), providers=providers, environ={"LOCAL_API_KEY": "sk-local"})
    return Retrying(TimeLimited(router, 10.0), max_attempts=4, base=0.1, cap=1.0, sleeper=sleeper)


async def expire_lease(db: psycopg.AsyncConnection[Any], run: Any) -> None:
    await db.execute("UPDATE run SET locked_until = now() - interval '1 second' WHERE id = %s", (run.id,))


async def test_a_run_with_parallel_tool_calls_succeeds_with_usage_and_cost(
    store: RunStore, chat: FakeOpenAi, llm: Retrying
) -> None:
    run, _ = await store.create(new_run("Which tickets are open?", model=MODEL, system="You triage tickets."))

    await worker(store, llm, [list_tickets], prices=PRICES).run_once()

    done = await store.get(run.id)
    assert done is not None and done.status is RunStatus.SUCCEEDED, done.error if done else None
    steps = await store.timeline(run.id)
    assert [s.kind for s in steps] == [StepKind.MODEL, StepKind.TOOL, StepKind.TOOL, StepKind.MODEL]
    assert len(chat.requests) == 2
    # The model id without its prefix, the key from the variable the file names, the file's header.
    assert all(b["model"] == "qwen3-8b" for b in chat.requests)
    assert chat.received[0].headers["Authorization"] == "Bearer sk-local"
    assert chat.received[0].headers["X-Tenant"] == "agentrun-tests"
    second = chat.requests[1]["messages"]
    assert [m["role"] for m in second] == ["system", "user", "assistant", "tool", "tool"]
    assert [c["id"] for c in second[2]["tool_calls"]] == ["call_00_0", "call_00_1"]
    assert [m["tool_call_id"] for m in second[3:]] == ["call_00_0", "call_00_1"]
    assert second[4]["content"] == "part 1: open tickets T-1, T-2 (key call_00_1)"
    final = await store.steps(run.id)
    assert "part 0: open tickets" in (final[-1].response or "") and "part 1" in (final[-1].response or "")

    models = [s for s in steps if s.kind is StepKind.MODEL]
    assert models[1].cache_read_input_tokens > models[0].cache_read_input_tokens > 0  # the system prompt, then more
    for s in models:
        expected = (s.input_tokens * Decimal("0.20") + s.output_tokens * Decimal("0.80")
                    + s.cache_read_input_tokens * Decimal("0.05")) / 1_000_000
        assert s.cost_usd == expected.quantize(Decimal("0.000001"))
    assert done.cost_usd == sum(s.cost_usd for s in models if s.cost_usd is not None) and done.cost_usd > 0
    assert done.tokens_used == sum(s.input_tokens + s.output_tokens + s.cache_read_input_tokens for s in models)


async def test_a_crash_resumes_without_repeating_a_model_call(
    store: RunStore, db: psycopg.AsyncConnection[Any], chat: FakeOpenAi, llm: Retrying
) -> None:
    executed: list[str] = []

    @tool(name="list_tickets", description="List support tickets by status.")
    def crashing(args: dict[str, Any], ctx: ToolContext) -> str:
        executed.append(ctx.idempotency_key)
        if len(executed) == 2:  # the second of the two parallel calls: the first is checkpointed
            raise SimulatedCrash()
        return f"tickets for part {args.get('part')}"

    run, _ = await store.create(new_run("Which tickets are open?", model=MODEL))
    with pytest.raises(SimulatedCrash):
        await worker(store, llm, [crashing], "worker-A").run_once()
    await expire_lease(db, run)
    assert await worker(store, llm, [crashing], "worker-B").run_once() == run.id

    done = await store.get(run.id)
    assert done is not None and done.status is RunStatus.SUCCEEDED, done.error
    assert len(chat.requests) == 2  # the first model call was not repeated
    assert executed == ["call_00_0", "call_00_1", "call_00_1"]  # only the unfinished tool ran again, same key
    # The resumed request carries the checkpointed turn converted back the same way.
    assert [m["role"] for m in chat.requests[1]["messages"]] == ["user", "assistant", "tool", "tool"]


async def test_429_waits_its_retry_after_then_succeeds(
    store: RunStore, chat: FakeOpenAi, llm: Retrying, sleeper: RecordingSleeper
) -> None:
    chat.script(rate_limited(retry_after=7))
    run, _ = await store.create(new_run("Which tickets are open?", model=MODEL))

    await worker(store, llm, [list_tickets]).run_once()

    done = await store.get(run.id)
    assert done is not None and done.status is RunStatus.SUCCEEDED, done.error
    assert sleeper.waits == [7.0]  # above the 1s backoff cap: the server's retry-after wins
    assert len(chat.requests) == 3


async def test_400_fails_the_run_at_once_with_the_message(
    store: RunStore, chat: FakeOpenAi, llm: Retrying, sleeper: RecordingSleeper
) -> None:
    chat.script(bad_request("This model's maximum context length is 8192 tokens."))
    run, _ = await store.create(new_run("Which tickets are open?", model=MODEL))

    await worker(store, llm, [list_tickets]).run_once()

    done = await store.get(run.id)
    assert done is not None and done.status is RunStatus.FAILED
    assert done.error is not None and "maximum context length is 8192 tokens" in done.error and "400" in done.error
    assert "Traceback" not in done.error
    assert len(chat.requests) == 1 and sleeper.waits == []
    assert await store.steps(run.id) == []


async def test_an_unknown_provider_fails_the_run_naming_the_known_ones(
    store: RunStore, chat: FakeOpenAi, llm: Retrying, sleeper: RecordingSleeper
) -> None:
    # The API refuses it at submit; a run that reaches a worker anyway (another worker's providers file,
    # the operator) fails with the reason instead of crashing the worker.
    run, _ = await store.create(new_run("hi", model="elsewhere/model-x"))

    await worker(store, llm, [list_tickets]).run_once()

    done = await store.get(run.id)
    assert done is not None and done.status is RunStatus.FAILED
    assert done.error is not None and "unknown model provider 'elsewhere'" in done.error
    assert "anthropic, bedrock, vertex, local" in done.error
    assert chat.requests == [] and sleeper.waits == []
