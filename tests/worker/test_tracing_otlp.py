"""End to end over OTLP/HTTP: two workers configured by OTEL_* variables export to a local receiver across a
crash and a takeover; the receiver decodes the protobuf and sees one trace, spans from both, no content."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from agentrun.worker.core.records import RunStatus
from agentrun.worker.obs.tracing import tracer_from_env
from agentrun.worker.store import RunStore
from agentrun.worker.testing.scripted import ScriptedLlm
from agentrun.worker.tools import ToolContext, tool
from tests.support.builders import SimulatedCrash, new_run, worker
from tests.worker.otlp_receiver import Receiver, receiving


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with receiving() as r:
        yield r


async def test_one_trace_across_a_crash_and_a_takeover(
    store: RunStore, db: psycopg.AsyncConnection[Any], receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment.name=test")
    tracer_a = tracer_from_env(os.environ, "worker-A")
    tracer_b = tracer_from_env(os.environ, "worker-B")
    assert tracer_a is not None and tracer_b is not None

    calls = 0

    @tool(name="lookup", description="crashes its worker the first time")
    async def lookup(args: dict[str, Any], ctx: ToolContext) -> str:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise SimulatedCrash()
        return "tool-output-text"

    llm = ScriptedLlm().then_tool_use("toolu_1", "lookup", {"q": "tool-input-text"}).then_text("final-answer-text")
    run, _ = await store.create(new_run("run-input-text", system="system-prompt-text"))
    try:
        with pytest.raises(SimulatedCrash):
            await worker(store, llm, [lookup], "worker-A", observer=tracer_a).run_once()
        await db.execute("UPDATE run SET locked_until = now() - interval '1 second' WHERE id = %s", (run.id,))
        assert await worker(store, llm, [lookup], "worker-B", observer=tracer_b).run_once() == run.id
    finally:
        for t in (tracer_a, tracer_b):
            with contextlib.suppress(Exception):
                await asyncio.to_thread(t.shutdown)  # flushes what the batch processor holds
    after = await store.get(run.id)
    assert after is not None and after.status is RunStatus.SUCCEEDED

    assert set(receiver.paths) == {"/v1/traces"}
    spans = receiver.spans()
    assert {span.trace_id for _, span in spans} == {run.id.bytes}  # one trace, the run's
    by_worker: dict[str, list[str]] = {}
    for resource, span in spans:
        assert resource["service.name"] == "agentrun"
        assert resource["deployment.environment.name"] == "test"
        by_worker.setdefault(resource["service.instance.id"], []).append(span.name)
    model = run.model
    assert sorted(by_worker["worker-A"]) == sorted([f"chat {model}", "execute_tool lookup", "invoke_agent"])
    assert sorted(by_worker["worker-B"]) == sorted(["execute_tool lookup", f"chat {model}", "invoke_agent"])
    roots = {resource["service.instance.id"]: span for resource, span in spans if span.name == "invoke_agent"}
    assert [e.name for e in roots["worker-B"].events] == ["lease_takeover"]
    assert roots["worker-A"].status.code == 2  # STATUS_CODE_ERROR: the crash
    # Each worker's step spans are children of its own run span.
    for resource, span in spans:
        if span.name != "invoke_agent":
            assert span.parent_span_id == roots[resource["service.instance.id"]].span_id
    # No content by default: neither the attributes nor the texts anywhere in what was sent.
    keys = {a.key for _, span in spans for a in span.attributes}
    assert not keys & {"gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.system_instructions",
                       "gen_ai.tool.call.arguments", "gen_ai.tool.call.result"}
    assert {"gen_ai.usage.input_tokens", "gen_ai.tool.call.id", "gen_ai.request.model"} <= keys
    raw = b"".join(receiver.bodies)
    for text in (b"run-input-text", b"system-prompt-text", b"tool-input-text", b"tool-output-text", b"final-answer-text"):
        assert text not in raw
