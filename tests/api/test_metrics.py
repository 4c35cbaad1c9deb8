"""/metrics after runs driven by a worker: the series the issue names, with the values the runs imply."""

from __future__ import annotations

from typing import Any

import httpx
import psycopg
from prometheus_client.parser import text_string_to_metric_families

from agentrun.worker.core.types import LlmError, LlmResponse, Usage
from agentrun.worker.obs.metrics import METRIC_NAMES, Metrics
from agentrun.worker.store import RunStore
from agentrun.worker.testing.scripted import ScriptedLlm
from agentrun.worker.tools import ToolBox
from tests.support.builders import MODEL, new_run, worker

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def scrape(client: httpx.AsyncClient) -> Samples:
    r = await client.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    out: Samples = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def test_metrics_after_runs(client: httpx.AsyncClient, store: RunStore, toolbox: ToolBox, metrics: Metrics) -> None:
    await store.create(new_run("first-run-input"))
    llm = (
        ScriptedLlm()
        .then_response(LlmResponse(
            [{"type": "tool_use", "id": "t1", "name": "lookup", "input": {"q": "a"}},
             {"type": "tool_use", "id": "t2", "name": "broken", "input": {}}],
            "tool_use", Usage(1000, 100, 200, 300)))
        .then_text("done", 50, 10)
        .then_fail(LlmError(400, None, "bad request"))
    )
    w = worker(store, llm, toolbox, observer=metrics)
    await w.run_once()
    await store.create(new_run("second-run-input"))
    await w.run_once()
    await store.create(new_run("waits"))

    samples = await scrape(client)
    families = {name for name, _ in samples} | {
        f.name for f in text_string_to_metric_families((await client.get("/metrics")).text)
    }
    for name in METRIC_NAMES:
        assert name in families or name.removesuffix("_total") in families, name

    assert value(samples, "agentrun_tokens_total", model=MODEL, direction="input") == 1050
    assert value(samples, "agentrun_tokens_total", model=MODEL, direction="output") == 110
    assert value(samples, "agentrun_tokens_total", model=MODEL, direction="cache_write") == 200
    assert value(samples, "agentrun_tokens_total", model=MODEL, direction="cache_read") == 300
    assert value(samples, "agentrun_cost_usd_total", model=MODEL) > 0
    assert value(samples, "agentrun_step_latency_seconds_count", kind="MODEL", outcome="ok") == 2
    assert value(samples, "agentrun_step_latency_seconds_count", kind="MODEL", outcome="error") == 1
    assert value(samples, "agentrun_step_latency_seconds_count", kind="TOOL", outcome="ok") == 1
    assert value(samples, "agentrun_step_latency_seconds_count", kind="TOOL", outcome="error") == 1
    assert value(samples, "agentrun_tool_errors_total", tool="broken") == 1
    assert value(samples, "agentrun_claims_total") == 2
    assert value(samples, "agentrun_lease_takeovers_total") == 0
    assert value(samples, "agentrun_runs_in_flight") == 0
    # Every status is present, counted from the database.
    assert {s: value(samples, "agentrun_runs", status=s) for s in
            ("QUEUED", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT")} == {
        "QUEUED": 1, "RUNNING": 0, "SUCCEEDED": 1, "FAILED": 1, "CANCELLED": 0, "TIMED_OUT": 0}
    # No run input in any label value.
    assert not [v for _, labels in samples for _, v in labels if "run-input" in v]


async def test_a_claim_of_a_lapsed_lease_counts_as_a_takeover(
    store: RunStore, toolbox: ToolBox, metrics: Metrics, db: psycopg.AsyncConnection[Any], client: httpx.AsyncClient
) -> None:
    await store.create(new_run())
    assert await store.claim("worker-dead", 30) is not None
    await db.execute("UPDATE run SET locked_until = now() - interval '1 second'")
    w = worker(store, ScriptedLlm().then_text("done"), toolbox, name="worker-B", observer=metrics)
    await w.run_once()
    samples = await scrape(client)
    assert value(samples, "agentrun_claims_total") == 1
    assert value(samples, "agentrun_lease_takeovers_total") == 1


async def test_runs_gauge_is_cached(store: RunStore) -> None:
    calls = 0

    async def count() -> dict[str, int]:
        nonlocal calls
        calls += 1
        return await store.count_by_status()

    m = Metrics(count_runs=count, cache_seconds=3600)
    await m.exposition()
    await m.exposition()
    assert calls == 1
    m.model_retry(529)
    assert b'agentrun_model_retries_total{status="529"} 1.0' in await m.exposition()
