"""A real Prometheus scrapes a live worker that ran a few runs, with the chart's alert rules loaded: every
PromQL expression of the Grafana dashboard and every alert evaluates without error and finds data (a
misspelt metric or label would find none)."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import yaml

from agentrun.worker.api.app import create_app
from agentrun.worker.core.types import LlmError, LlmResponse, Usage
from agentrun.worker.llm.limits import Limited, Limiter, ModelLimits
from agentrun.worker.llm.retry import Retrying
from agentrun.worker.obs.metrics import Metrics
from agentrun.worker.settings import WorkerSettings
from agentrun.worker.store import RunStore
from agentrun.worker.testing.scripted import ScriptedLlm
from agentrun.worker.tools import ToolBox
from tests.chart.prometheus_tools import (
    RULES_VALUES,
    alert_exprs,
    concrete,
    dashboard,
    dashboard_promql,
    require,
    selectors,
    write_rules,
)
from tests.support.api import broken, lookup, noop
from tests.support.builders import MODEL, new_run, worker
from tests.support.chart import NAMESPACE, Manifest
from tests.support.ports import free_port
from tests.support.serving import serving
from tests.support.waiting import eventually

POD = "worker-0"


@contextlib.asynccontextmanager
async def prometheus(target: str, rules: Path, tmp: Path) -> AsyncIterator[httpx.AsyncClient]:
    """A Prometheus scraping `target` every second as the chart's ServiceMonitor would label it."""
    binary = require("prometheus")
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "scrape_configs": [{
            "job_name": "agentrun",
            "metrics_path": "/metrics",
            "static_configs": [{"targets": [target], "labels": {"namespace": NAMESPACE, "pod": POD}}],
        }],
    }
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = (tmp / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [binary, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            async def ready() -> bool:
                if proc.poll() is not None:
                    raise AssertionError(f"prometheus exited: {(tmp / 'prometheus.log').read_text()[-2000:]}")
                with contextlib.suppress(httpx.HTTPError):
                    return (await client.get("/-/ready")).status_code == 200
                return False

            await eventually(ready, 90, "prometheus to be ready")
            yield client
    finally:
        proc.terminate()
        try:
            await asyncio.to_thread(proc.wait, 30)
        except subprocess.TimeoutExpired:
            proc.kill()
            await asyncio.to_thread(proc.wait)
        log.close()


# Waits happen only when a limit is reached, which these runs never do: those series are there, their
# rate over the window may not be.
ONLY_WITH_LIMITS = {"Model limit waits"}
WAIT_SERIES = {"agentrun_model_limit_waits_total", "agentrun_model_limit_wait_seconds_total"}


async def query(client: httpx.AsyncClient, promql: str) -> list[dict[str, Any]]:
    r = await client.get("/api/v1/query", params={"query": promql})
    body = r.json()
    assert r.status_code == 200 and body["status"] == "success", f"{promql}: {body.get('error', r.text)}"
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


async def some_runs(store: RunStore, db: psycopg.AsyncConnection[Any], metrics: Metrics) -> None:
    """Runs that touch every series: tool errors, a retried rate limit, a failed run, a takeover, a queued run."""
    async def no_wait(seconds: float) -> None:
        pass

    scripted = (
        ScriptedLlm()
        .then_response(LlmResponse(
            [{"type": "tool_use", "id": "t1", "name": "lookup", "input": {"q": "a"}},
             {"type": "tool_use", "id": "t2", "name": "broken", "input": {}}],
            "tool_use", Usage(1000, 100, 200, 300)))
        .then_text("done", 50, 10)
        .then_fail(LlmError(429, 0.0, "slow down"))
        .then_text("after the retry", 20, 5)
        .then_fail(LlmError(400, None, "bad request"))
        .then_text("taken over", 10, 2)
    )
    # Under a fleet-wide model limit, so its series are there too (a limit that never makes a call wait).
    limiter = Limiter(ModelLimits.parse({"claude-*": {"maxConcurrentRequests": 100}}), store.pool,
                      on_wait=metrics.limit_waited, on_use=metrics.limit_seen)
    llm = Retrying(Limited(scripted, limiter), sleeper=no_wait, on_retry=metrics.model_retry)
    w = worker(store, llm, ToolBox([noop, lookup, broken]), observer=metrics)
    for text in ("with tools", "retried", "fails"):
        await store.create(new_run(text))
        assert await w.run_once() is not None
    # A run whose first worker died holding it: the next claim is a takeover.
    run, _ = await store.create(new_run("orphaned"))
    assert (await store.claim("worker-dead", 30)) is not None
    await db.execute("UPDATE run SET locked_until = now() - interval '1 second' WHERE id = %s", (run.id,))
    assert await w.run_once() == run.id
    await store.create(new_run("still queued"))


@pytest.mark.slow
async def test_dashboard_and_alerts_against_a_real_prometheus(
    store: RunStore, db: psycopg.AsyncConnection[Any], render: Callable[..., list[Manifest]], tmp_path: Path
) -> None:
    require("prometheus")
    manifests = render(extra=RULES_VALUES)
    rules = write_rules(manifests, tmp_path)
    metrics = Metrics(count_runs=store.count_by_status, cache_seconds=0, count_tenants=store.count_by_tenant)
    app = create_app(store, ToolBox([noop, lookup, broken]), WorkerSettings(database_url="unused", default_model=MODEL),
                     metrics)
    async with serving(app) as url, prometheus(url.removeprefix("http://"), rules, tmp_path) as prom:
        async def scraped_once() -> bool:
            return bool(await query(prom, 'up{job="agentrun"} == 1'))

        await eventually(scraped_once, 90, "the first scrape of the worker")
        await some_runs(store, db, metrics)

        async def scraped_the_runs() -> bool:
            # Every sample of the last 3 seconds saw all four claims: the windows hold samples before and after.
            return bool(await query(prom, f'min_over_time(agentrun_claims_total{{namespace="{NAMESPACE}"}}[3s]) >= 4'))

        await eventually(scraped_the_runs, 90, "scrapes that saw the runs")

        # The dashboard's namespace variable finds the namespace.
        r = await prom.get("/api/v1/label/namespace/values", params={"match[]": "agentrun_runs"})
        assert NAMESPACE in r.json()["data"]

        exprs = dashboard_promql()
        assert len(exprs) >= 15  # every Prometheus target, collapsed rows included
        empty = {}
        for title, expr in exprs.items():
            if not await query(prom, concrete(expr, NAMESPACE)) and title.split(" [")[0] not in ONLY_WITH_LIMITS:
                empty[title] = expr
        assert not empty, f"dashboard queries that found no data: {empty}"

        # Every selector of the dashboard and the alerts matches series: no misspelt metric, label or value.
        board_selectors = {s for e in exprs.values() for s in selectors(concrete(e, NAMESPACE))}
        alerts = alert_exprs(manifests)
        rule_selectors = {s for e in alerts.values() for s in selectors(e)}
        missing = [s for s in sorted(board_selectors | rule_selectors)
                   if not await query(prom, f"count({s})") and s.split("{")[0] not in WAIT_SERIES]
        assert not missing, f"selectors that match no series: {missing}"

        for expr in alerts.values():
            await query(prom, expr)  # valid PromQL over real series (empty: healthy, as these runs are)

        async def rules_evaluated() -> bool:
            groups = (await prom.get("/api/v1/rules")).json()["data"]["groups"]
            seen = {r["name"]: r for g in groups for r in g["rules"]}
            return set(alerts) <= set(seen) and all(
                not seen[a]["lastEvaluation"].startswith("0001") for a in alerts)

        await eventually(rules_evaluated, 60, "Prometheus to evaluate every alert rule")
        groups = (await prom.get("/api/v1/rules")).json()["data"]["groups"]
        for rule in (r for g in groups for r in g["rules"]):
            assert rule["health"] == "ok", (rule["name"], rule.get("lastError"))
            assert rule["state"] == "inactive", (rule["name"], "a healthy worker must not trip it")

    assert {v["name"] for v in dashboard()["templating"]["list"]} >= {"datasource", "namespace", "tempo", "run"}
