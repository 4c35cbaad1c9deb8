"""A real `agentrun worker` process with OTEL_EXPORTER_OTLP_ENDPOINT: a run submitted with a traceparent is
traced over OTLP/HTTP into the caller's trace, its logs carry the ids, and a bad variable stops the start."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import httpx

from agentrun.worker.core.records import RunStatus
from agentrun.worker.obs.tracing import parse_traceparent
from agentrun.worker.store import RunStore
from agentrun.worker.testing.fake_server import FakeAnthropic, Reply
from tests.support.ports import free_port
from tests.support.processes import start_worker, wait_ready
from tests.worker.otlp_receiver import receiving

REPO = Path(__file__).resolve().parents[2]
CALLER = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _env(database_url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update({"AGENTRUN_DATABASE_URL": database_url, "AGENTRUN_LOG_FORMAT": "json", "PYTHONPATH": str(REPO),
                "AGENTRUN_LLM_BACKOFF_BASE_SECONDS": "0.01", **extra})
    return env


async def test_a_worker_process_exports_its_runs_trace(store: RunStore, database_url: str) -> None:
    port = free_port()
    with receiving() as receiver:
        async with FakeAnthropic() as api:
            api.script(Reply.rate_limited(0), Reply.text("done"))
            proc = await start_worker(
                port, "--id", "traced-worker", "--concurrency", "1", "--poll-interval", "0.1",
                env=_env(database_url, ANTHROPIC_BASE_URL=api.base_url, OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url),
            )
            try:
                async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
                    deadline = time.monotonic() + 60
                    # migrated and serving
                    await wait_ready(f"http://127.0.0.1:{port}", proc, timeout=60, what="the worker to become ready")
                    r = await http.post("/api/runs", json={"input": "hello", "tokenBudget": 1000, "timeoutSeconds": 60},
                                        headers={"traceparent": CALLER})
                    assert r.status_code == 201, r.text
                    run_id = r.json()["id"]
                    while True:
                        run = await store.get(run_id)
                        if run is not None and run.status.terminal:
                            break
                        assert proc.returncode is None, "the worker exited"
                        assert time.monotonic() < deadline + 60, "the run did not finish"
                        await asyncio.sleep(0.05)
            finally:
                proc.terminate()  # SIGTERM: the worker stops, and its tracer exports what it buffered
                output, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert run.status is RunStatus.SUCCEEDED, run.error
    assert proc.returncode == 0, output.decode(errors="replace")[-3000:]

    caller = parse_traceparent(CALLER)
    spans = receiver.spans()
    assert {span.name for _, span in spans} == {"invoke_agent", f"chat {run.model}"}
    assert {span.trace_id for _, span in spans} == {caller.trace_id.to_bytes(16, "big")}
    root = next(span for _, span in spans if span.name == "invoke_agent")
    chat = next(span for _, span in spans if span.name.startswith("chat"))
    assert root.parent_span_id == caller.span_id.to_bytes(8, "big")
    assert chat.parent_span_id == root.span_id
    assert [e.name for e in chat.events] == ["rate_limit_wait"]
    attrs = {a.key: a.value for a in chat.attributes}
    assert attrs["gen_ai.response.id"].string_value.startswith("msg_")
    assert attrs["gen_ai.response.model"].string_value == run.model
    assert {resource["service.instance.id"] for resource, _ in spans} == {"traced-worker"}

    records = [json.loads(line) for line in output.decode().splitlines() if line.startswith("{")]
    step_lines = [r for r in records if "MODEL" in r.get("message", "")]
    assert step_lines and all(
        r["trace"]["id"] == f"{caller.trace_id:032x}" and r["span"]["id"] == chat.span_id.hex() for r in step_lines)


async def test_a_bad_tracing_variable_stops_the_worker_with_its_name(database_url: str) -> None:
    proc = await start_worker(
        free_port(), env=_env(database_url, ANTHROPIC_BASE_URL="http://127.0.0.1:9", OTEL_TRACES_EXPORTER="zipkin"),
    )
    output, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode != 0
    text = output.decode(errors="replace")
    assert "agentrun: OTEL_TRACES_EXPORTER: unknown exporter 'zipkin'" in text
    assert "Traceback" not in text
