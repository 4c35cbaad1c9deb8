"""Spans of runs, read from the SDK's in-memory exporter: their shape, the GenAI attributes, one trace per run."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from agentrun.worker.core.observer import Observers
from agentrun.worker.core.records import RunStatus
from agentrun.worker.core.types import LlmError, LlmResponse, Usage
from agentrun.worker.llm.retry import Retrying
from agentrun.worker.obs import logs
from agentrun.worker.obs.metrics import Metrics
from agentrun.worker.obs.tracing import enabled, parse_traceparent, run_trace_id, tracer_from_env
from agentrun.worker.obs.tracing.context import TRACEPARENT_PATTERN
from agentrun.worker.obs.tracing.spans import RunTracer, new_provider, provider_and_model
from agentrun.worker.store import LeaseLost, RunStore
from agentrun.worker.testing.scripted import ScriptedLlm
from agentrun.worker.tools import ToolContext, tool
from tests.support.builders import MODEL, SimulatedCrash, new_run, worker

CALLER = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
CONTENT_KEYS = {"gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.system_instructions",
                "gen_ai.tool.call.arguments", "gen_ai.tool.call.result"}


class Traced:
    def __init__(self, worker_id: str = "worker-A", capture: bool = False) -> None:
        self.exporter = InMemorySpanExporter()
        provider = new_provider()
        provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = RunTracer(provider, worker_id, capture_content=capture)

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def named(self, prefix: str) -> list[ReadableSpan]:
        return [s for s in self.spans() if s.name.startswith(prefix)]


@tool(name="lookup", description="finds things")
async def lookup(args: dict[str, Any], ctx: ToolContext) -> str:
    return "found " + str(args.get("q"))


@tool(name="broken", description="always fails")
async def broken(args: dict[str, Any], ctx: ToolContext) -> str:
    raise RuntimeError("the tool broke")


def two_turns() -> ScriptedLlm:
    return (
        ScriptedLlm()
        .then_response(LlmResponse(
            [{"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"q": "secret-query"}},
             {"type": "tool_use", "id": "toolu_2", "name": "broken", "input": {}}],
            "tool_use", Usage(100, 20, 30, 40), id="msg_1", model="claude-sonnet-4-5-20250929"))
        .then_response(LlmResponse([{"type": "text", "text": "the-final-answer"}], "end_turn", Usage(150, 5),
                                   id="msg_2", model="claude-sonnet-4-5-20250929"))
    )


async def test_a_run_is_one_trace_of_gen_ai_spans(store: RunStore) -> None:
    t = Traced()
    run, _ = await store.create(new_run("the-secret-input", system="the-system-prompt"))
    assert await worker(store, two_turns(), [lookup, broken], observer=Observers(Metrics(), t.tracer)).run_once() == run.id

    spans = t.spans()
    assert [s.name for s in spans] == [
        f"chat {MODEL}", "execute_tool lookup", "execute_tool broken", f"chat {MODEL}", "invoke_agent",
    ]
    root = t.named("invoke_agent")[0]
    assert {s.context.trace_id for s in spans} == {run.id.int} == {run_trace_id(run.id, None)}
    assert root.parent is None
    assert all(s.parent is not None and s.parent.span_id == root.context.span_id for s in spans if s is not root)
    assert root.attributes is not None and dict(root.attributes) == {
        "gen_ai.operation.name": "invoke_agent", "gen_ai.provider.name": "anthropic", "gen_ai.request.model": MODEL,
        "gen_ai.conversation.id": str(run.id), "agentrun.run.id": str(run.id), "agentrun.worker.id": "worker-A",
        "agentrun.run.status": "SUCCEEDED",
    }
    assert root.status.status_code is StatusCode.UNSET

    first, second = t.named("chat")
    assert first.kind is SpanKind.CLIENT
    assert dict(first.attributes or {}) == {
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": "anthropic", "gen_ai.request.model": MODEL,
        "gen_ai.conversation.id": str(run.id), "gen_ai.request.max_tokens": 4096,
        "gen_ai.response.id": "msg_1", "gen_ai.response.model": "claude-sonnet-4-5-20250929",
        "gen_ai.response.finish_reasons": ("tool_use",),
        # the conventions count cache reads and writes within input_tokens
        "gen_ai.usage.input_tokens": 100 + 30 + 40, "gen_ai.usage.output_tokens": 20,
        "gen_ai.usage.cache_creation.input_tokens": 30, "gen_ai.usage.cache_read.input_tokens": 40,
        "agentrun.step.seq": 1,
    }
    assert (second.attributes or {})["gen_ai.response.finish_reasons"] == ("end_turn",)
    assert (second.attributes or {})["agentrun.step.seq"] == 4

    ok, failed = t.named("execute_tool")
    assert dict(ok.attributes or {}) == {
        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "lookup", "gen_ai.tool.call.id": "toolu_1",
        "gen_ai.tool.type": "function", "gen_ai.conversation.id": str(run.id),
        "agentrun.step.seq": 2, "agentrun.step.attempt": 1,
    }
    assert ok.status.status_code is StatusCode.UNSET
    assert failed.status.status_code is StatusCode.ERROR
    assert (failed.attributes or {})["error.type"] == "tool_error"

    # No content unless asked for: neither the attribute keys nor the texts anywhere.
    everything = json.dumps([dict(s.attributes or {}) for s in spans] + [
        {e.name: dict(e.attributes or {}) for e in s.events} for s in spans], default=str)
    assert not CONTENT_KEYS & {k for s in spans for k in (s.attributes or {})}
    for text in ("the-secret-input", "the-system-prompt", "secret-query", "found", "the-final-answer"):
        assert text not in everything


async def test_content_is_recorded_when_asked_for(store: RunStore) -> None:
    t = Traced(capture=True)
    await store.create(new_run("the-secret-input", system="the-system-prompt"))
    await worker(store, two_turns(), [lookup, broken], observer=t.tracer).run_once()
    first, second = t.named("chat")
    attrs = first.attributes or {}
    assert json.loads(str(attrs["gen_ai.input.messages"])) == [
        {"role": "user", "parts": [{"type": "text", "content": "the-secret-input"}]}]
    assert json.loads(str(attrs["gen_ai.system_instructions"])) == [{"type": "text", "content": "the-system-prompt"}]
    out = json.loads(str(attrs["gen_ai.output.messages"]))
    assert out[0]["role"] == "assistant" and out[0]["finish_reason"] == "tool_use"
    assert out[0]["parts"][0] == {"type": "tool_call", "id": "toolu_1", "name": "lookup", "arguments": {"q": "secret-query"}}
    tool_span = t.named("execute_tool lookup")[0]
    assert json.loads(str((tool_span.attributes or {})["gen_ai.tool.call.arguments"])) == {"q": "secret-query"}
    assert (tool_span.attributes or {})["gen_ai.tool.call.result"] == "found secret-query"
    assert "tool_call_response" in str((second.attributes or {})["gen_ai.input.messages"])


async def test_the_callers_traceparent_is_the_parent(store: RunStore) -> None:
    t = Traced()
    run, _ = await store.create(new_run(traceparent=CALLER))
    assert (await store.get(run.id)) is not None and run.traceparent == CALLER
    await worker(store, ScriptedLlm().then_text("hi"), [], observer=t.tracer).run_once()
    caller = parse_traceparent(CALLER)
    root = t.named("invoke_agent")[0]
    assert {s.context.trace_id for s in t.spans()} == {caller.trace_id}
    assert root.parent is not None and root.parent.span_id == caller.span_id and root.parent.is_remote


async def test_a_failed_model_call_and_its_retries(store: RunStore) -> None:
    t = Traced()
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    scripted = ScriptedLlm().then_fail(LlmError(429, 2.0)).then_fail(LlmError(529)).then_fail(LlmError(400, None, "bad"))
    llm = Retrying(scripted, max_attempts=5, sleeper=sleep, on_retry=t.tracer.model_retry)
    run, _ = await store.create(new_run())
    await worker(store, llm, [], observer=t.tracer).run_once()
    assert (after := await store.get(run.id)) is not None and after.status is RunStatus.FAILED
    chat = t.named("chat")[0]
    assert [(e.name, dict(e.attributes or {})) for e in chat.events] == [
        ("rate_limit_wait", {"http.response.status_code": 429, "error.type": "429"}),
        ("retry", {"http.response.status_code": 529, "error.type": "529"}),
        ("exception", chat.events[2].attributes),
    ]
    # The recorded exception is the final 400, not whatever the span happened to hold.
    exception = dict(chat.events[2].attributes or {})
    assert str(exception["exception.type"]).endswith("LlmError"), exception
    assert exception["exception.message"] == "model error 400: bad", exception
    assert chat.status.status_code is StatusCode.ERROR and (chat.attributes or {})["error.type"] == "400"
    root = t.named("invoke_agent")[0]
    assert root.status.status_code is StatusCode.ERROR
    assert (root.attributes or {})["agentrun.run.status"] == "FAILED" and (root.attributes or {})["error.type"] == "FAILED"


async def test_a_takeover_is_an_event_on_the_next_workers_run_span(store: RunStore, db: psycopg.AsyncConnection[Any]) -> None:
    a, b = Traced("worker-A"), Traced("worker-B")
    calls = 0

    @tool(name="lookup", description="crashes the first time")
    async def crashing(args: dict[str, Any], ctx: ToolContext) -> str:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise SimulatedCrash()
        return "found"

    llm = ScriptedLlm().then_tool_use("toolu_1", "lookup", {"q": "x"}).then_text("done")
    run, _ = await store.create(new_run())
    with pytest.raises(SimulatedCrash):
        await worker(store, llm, [crashing], "worker-A", observer=a.tracer).run_once()
    await db.execute("UPDATE run SET locked_until = now() - interval '1 second' WHERE id = %s", (run.id,))
    await worker(store, llm, [crashing], "worker-B", observer=b.tracer).run_once()

    assert {s.context.trace_id for s in a.spans() + b.spans()} == {run.id.int}
    root_a, root_b = a.named("invoke_agent")[0], b.named("invoke_agent")[0]
    assert root_a.status.status_code is StatusCode.ERROR  # the crash, as far as worker A could tell
    assert a.named("execute_tool")[0].status.status_code is StatusCode.ERROR
    assert [(e.name, dict(e.attributes or {})) for e in root_b.events] == [
        ("lease_takeover", {"agentrun.worker.previous": "worker-A"})]
    assert (b.named("execute_tool")[0].attributes or {})["agentrun.step.attempt"] == 2
    assert (root_b.attributes or {})["agentrun.run.status"] == "SUCCEEDED"


@pytest.fixture
def json_log() -> Iterator[io.StringIO]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(logs.ContextFilter())
    handler.setFormatter(logs.formatter("json", logs.Redactor()))
    engine = logging.getLogger("agentrun.worker.runtime.engine")
    engine.addHandler(handler)
    old = engine.level
    engine.setLevel(logging.INFO)
    try:
        yield out
    finally:
        engine.removeHandler(handler)
        engine.setLevel(old)


async def test_log_lines_carry_the_trace_and_span_ids(store: RunStore, json_log: io.StringIO) -> None:
    t = Traced()
    run, _ = await store.create(new_run())
    await worker(store, ScriptedLlm().then_tool_use("toolu_1", "lookup", {"q": "x"}).then_text("done"), [lookup],
                 observer=t.tracer).run_once()
    lines = [json.loads(line) for line in json_log.getvalue().splitlines()]
    spans = {s.context.span_id: s for s in t.spans()}
    assert lines
    for line in lines:
        assert line["trace"]["id"] == f"{run.id.int:032x}"
        span = spans[int(line["span"]["id"], 16)]
        if "MODEL" in line["message"]:
            assert span.name == f"chat {MODEL}"
        elif "TOOL" in line["message"]:
            assert span.name == "execute_tool lookup"
        else:
            assert span.name == "invoke_agent"


def test_tracing_is_off_and_unimported_without_the_variables() -> None:
    assert tracer_from_env({}, "w") is None
    assert not enabled({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318", "OTEL_SDK_DISABLED": "true"})
    assert not enabled({"OTEL_TRACES_EXPORTER": "none"})
    assert enabled({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://x:4318/v1/traces"})
    assert enabled({"OTEL_TRACES_EXPORTER": "console"})
    # Nothing costs when tracing is off: the worker's modules do not even load the SDK.
    code = ("import sys, agentrun.worker.runtime.runner, agentrun.worker.obs.tracing, agentrun.worker.api.runs, "
            "agentrun.worker.obs.metrics; print(sorted(m for m in sys.modules if m.startswith('opentelemetry.sdk')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/")
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(("env", "problem"), [
    ({"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER: unknown exporter 'zipkin'"),
    ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "only http/protobuf"),
    ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "maybe"},
     "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT must be true or false"),
    ({"OTEL_SDK_DISABLED": "perhaps"}, "OTEL_SDK_DISABLED must be true or false"),
])
def test_bad_variables_are_named(env: dict[str, str], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        tracer_from_env(env, "w")


def test_a_tracer_needs_the_run_id_generator() -> None:
    from opentelemetry.sdk.trace import TracerProvider

    with pytest.raises(ValueError, match="new_provider"):
        RunTracer(TracerProvider(), "w")


@pytest.mark.parametrize(("text", "problem"), [
    ("", "must be a W3C traceparent"),
    ("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331", "must be a W3C traceparent"),
    (CALLER.upper(), "must be a W3C traceparent"),  # the spec's hex is lowercase
    (" " + CALLER, "must be a W3C traceparent"),
    ("ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "version ff; only version 00"),
    ("01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "version 01; only version 00"),
    ("00-00000000000000000000000000000000-b7ad6b7169203331-01", "all-zero"),
    ("00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01", "all-zero"),
    ("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra", "must be a W3C traceparent"),
    ("00-" + "a" * 600, "must be a W3C traceparent"),
    (CALLER + "\n", "must be a W3C traceparent"),
])
def test_malformed_traceparents_say_why(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        parse_traceparent(text)
    assert not re.fullmatch(TRACEPARENT_PATTERN, text)  # the documented pattern refuses it too


def test_traceparents_parse() -> None:
    parent = parse_traceparent(CALLER)
    assert parent.header() == CALLER and parent.sampled and re.match(TRACEPARENT_PATTERN, CALLER)
    assert not parse_traceparent(CALLER[:-2] + "00").sampled
    assert run_trace_id(uuid.UUID(int=5), CALLER) == 0x0AF7651916CD43DD8448EB211C80319C
    assert run_trace_id(uuid.UUID(int=5), None) == 5


def test_provider_names_follow_the_conventions() -> None:
    assert provider_and_model("claude-sonnet-4-6") == ("anthropic", "claude-sonnet-4-6")
    assert provider_and_model("bedrock/anthropic.claude-v2") == ("aws.bedrock", "anthropic.claude-v2")
    assert provider_and_model("vertex/claude-sonnet-4-6") == ("gcp.vertex_ai", "claude-sonnet-4-6")
    assert provider_and_model("openai/gpt-4o") == ("openai", "gpt-4o")


async def test_a_lost_lease_is_an_event_not_an_error(store: RunStore, db: psycopg.AsyncConnection[Any]) -> None:
    t = Traced()
    run, _ = await store.create(new_run())

    @tool(name="lookup", description="another worker takes the run while this runs")
    async def stolen(args: dict[str, Any], ctx: ToolContext) -> str:
        await db.execute("UPDATE run SET locked_by = 'worker-B' WHERE id = %s", (run.id,))
        return "found"

    llm = ScriptedLlm().then_tool_use("toolu_1", "lookup", {}).then_text("never")
    with pytest.raises(LeaseLost):
        await worker(store, llm, [stolen], observer=t.tracer).run_once()
    tool_span, root = t.named("execute_tool")[0], t.named("invoke_agent")[0]
    for span in (tool_span, root):
        assert [e.name for e in span.events] == ["lease_lost"]
        assert span.status.status_code is StatusCode.UNSET


async def test_a_cancel_is_an_event_on_the_interrupted_step(store: RunStore) -> None:
    from tests.support.running import finished
    from tests.support.running import running as serving

    t = Traced()
    started = asyncio.Event()

    @tool(name="slow", description="waits")
    async def slow(args: dict[str, Any], ctx: ToolContext) -> str:
        started.set()
        await asyncio.sleep(30)
        return "too late"

    run, _ = await store.create(new_run())
    async with serving(worker(store, ScriptedLlm().then_tool_use("toolu_1", "slow", {}), [slow], observer=t.tracer)):
        await asyncio.wait_for(started.wait(), 30)
        await store.cancel(run.id)
        assert (await finished(store, run.id, timeout=30)).status is RunStatus.CANCELLED
    tool_span, root = t.named("execute_tool")[0], t.named("invoke_agent")[0]
    assert [e.name for e in tool_span.events] == ["cancel_requested"]
    assert tool_span.status.status_code is StatusCode.UNSET
    assert (root.attributes or {})["agentrun.run.status"] == "CANCELLED"
    assert root.status.status_code is StatusCode.UNSET  # asked for, not an error


async def test_human_decisions_are_events_on_the_run_span(store: RunStore) -> None:
    from agentrun.worker.core.records import Decision

    first, second = Traced("worker-A"), Traced("worker-B")
    llm = ScriptedLlm().then_tool_use("toolu_1", "lookup", {"q": "x"}).then_text("done")
    run, _ = await store.create(new_run(require_approval=("lookup",)))
    await worker(store, llm, [lookup], "worker-A", observer=first.tracer).run_once()
    assert (parked := await store.get(run.id)) is not None and parked.status is RunStatus.WAITING
    waiting = first.named("invoke_agent")[0]
    assert [(e.name, dict(e.attributes or {})) for e in waiting.events] == [("waiting_for_decision", {
        "gen_ai.tool.name": "lookup", "gen_ai.tool.call.id": "toolu_1", "agentrun.decision.kind": "approval"})]

    await store.decide(run.id, "toolu_1", Decision.APPROVE, by="alice")
    await worker(store, llm, [lookup], "worker-B", observer=second.tracer).run_once()
    assert (after := await store.get(run.id)) is not None and after.status is RunStatus.SUCCEEDED
    root = second.named("invoke_agent")[0]
    decided = [e for e in root.events if e.name == "human_decision"]
    assert [dict(e.attributes or {}) for e in decided] == [{
        "gen_ai.tool.name": "lookup", "gen_ai.tool.call.id": "toolu_1", "agentrun.decision.kind": "approval",
        "agentrun.decision": "approve", "agentrun.decision.by": "alice"}]
    assert {s.context.trace_id for s in first.spans() + second.spans()} == {run.id.int}
    assert [s.name for s in second.named("execute_tool")] == ["execute_tool lookup"]


async def test_a_sub_agents_run_is_a_child_span_of_its_parents_in_one_trace(store: RunStore) -> None:
    from agentrun.worker.core.agents import Agent
    from agentrun.worker.testing.scripted import TreeLlm
    from tests.support.running import finished, running

    agent, _ = await store.put_agent(Agent(name="researcher", version=0, system="researcher"))
    parent, _ = await store.create(new_run("q", system="planner", sub_agents=(agent.ref,), traceparent=CALLER))
    traced = Traced()
    async with running(worker(store, TreeLlm(), observer=traced.tracer)):
        done = await finished(store, parent.id, 60)
    assert done.status is RunStatus.SUCCEEDED
    (child,) = await store.children(parent.id)
    spans = traced.named("invoke_agent")
    mine = [s for s in spans if s.attributes and s.attributes["agentrun.run.id"] == str(parent.id)]
    (theirs,) = [s for s in spans if s.attributes and s.attributes["agentrun.run.id"] == str(child.id)]
    assert len(mine) == 2  # the drive that made the child, and the one that took its answer
    assert theirs.context.trace_id == parse_traceparent(CALLER).trace_id
    assert theirs.parent is not None and theirs.parent.span_id in {s.context.span_id for s in mine}
