"""The dashboard and the alert rules query only series a live worker exposes on /metrics."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from agentrun.worker.core.records import RunStatus
from agentrun.worker.obs.metrics import METRIC_NAMES
from agentrun.worker.store import RunStore
from agentrun.worker.testing.fake_server import FakeAnthropic
from tests.chart.metric_names import names_in_queries, series_in_exposition
from tests.support.builders import new_run
from tests.support.chart import CHART, CI_VALUES, ROOT, Manifest, find
from tests.support.ports import free_port
from tests.support.processes import start_worker, stop, wait_ready
from tests.support.waiting import eventually

DASHBOARD = CHART / "dashboards" / "agentrun.json"


def _exprs(node: Any) -> Iterator[str]:
    """Every PromQL string in a dashboard: panel targets and query variables."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("expr", "definition") and isinstance(value, str):
                yield value
            elif key == "query" and isinstance(value, str | dict):
                yield value if isinstance(value, str) else value.get("query", "")
            else:
                yield from _exprs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _exprs(item)


def dashboard_queries() -> list[str]:
    return [q for q in _exprs(json.loads(DASHBOARD.read_text())) if q and q != "prometheus"]


def rule_queries(render: Callable[..., list[Manifest]]) -> list[str]:
    rule = find(render(_everything()), "PrometheusRule")
    return [r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]]


def _everything() -> Path:
    return next(v for v in CI_VALUES if v.name.startswith("everything"))


def test_dashboard_is_valid_grafana_json() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    for panel in panels:
        # The datasource is the template variable, so the dashboard works in any Grafana.
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]
    titles = " | ".join(p["title"] for p in panels).lower()
    for wanted in ("runs by status", "throughput", "p50 / p95", "tokens per model", "cache reads",
                   "cost per model", "retries by status", "takeovers", "in flight per worker"):
        assert wanted in titles


def test_the_dashboard_or_alerts_show_every_metric_the_worker_lists(render: Callable[..., list[Manifest]]) -> None:
    used = names_in_queries(dashboard_queries() + rule_queries(render))
    shown = {name for name in METRIC_NAMES if any(u == name or u.startswith(name + "_") for u in used)}
    assert set(METRIC_NAMES) - shown == set(), "these metrics are on no panel and in no alert"


def test_rules_cover_the_four_alerts(render: Callable[..., list[Manifest]]) -> None:
    rule = find(render(_everything()), "PrometheusRule")
    alerts = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    assert set(alerts) == {"AgentrunRunsFailing", "AgentrunCostPerRunHigh", "AgentrunRunsStuck",
                           "AgentrunLeaseTakeoversSpiking", "AgentrunWebhooksFailing", "AgentrunTenantThrottled"}
    for alert in alerts.values():
        assert alert["labels"]["severity"] in ("warning", "critical")
        assert alert["annotations"]["summary"]


@contextlib.asynccontextmanager
async def live_worker(database_url: str, model_url: str, log: Path) -> AsyncIterator[str]:
    """A real `agentrun worker` process on a free port; yields its base URL once /readyz answers 200."""
    port = free_port()
    env = {
        **os.environ, "AGENTRUN_DATABASE_URL": database_url, "ANTHROPIC_BASE_URL": model_url,
        "ANTHROPIC_API_KEY": "test-key", "PYTHONPATH": str(ROOT),
    }
    env.pop("AGENTRUN_API_TOKEN", None)
    with log.open("wb") as out:
        proc = await start_worker(port, "--id", "metrics-worker", "--concurrency", "1", "--poll-interval", "0.1",
                                  env=env, cwd=ROOT, stdout=out)
    url = f"http://127.0.0.1:{port}"
    try:
        await wait_ready(url, proc, timeout=60, output=lambda: log.read_text(errors="replace"))
        yield url
    finally:
        await stop(proc)


async def test_a_live_worker_exposes_every_series_the_dashboard_and_alerts_query(
    render: Callable[..., list[Manifest]], database_url: str, store: RunStore, tmp_path: Path
) -> None:
    async with FakeAnthropic() as api, live_worker(database_url, api.base_url, tmp_path / "worker.log") as url:
        # One run through the worker, so its counters and histograms have samples too, not only types.
        run, _ = await store.create(new_run("count the open tickets"))

        async def finished() -> bool:
            got = await store.get(run.id)
            return got is not None and got.status.terminal

        await eventually(finished, timeout=60, what="the run to finish")
        async with httpx.AsyncClient(timeout=10) as http:
            page = await http.get(f"{url}/metrics")
    assert page.status_code == 200, page.text
    done = await store.get(run.id)
    assert done is not None and done.status is RunStatus.SUCCEEDED, done

    exposed = series_in_exposition(page.text)
    assert "agentrun_claims_total" in exposed, page.text  # the page is really the worker's
    queries = [("dashboard", q) for q in dashboard_queries()] + [("alert", q) for q in rule_queries(render)]
    missing = {(where, name) for where, q in queries for name in names_in_queries([q]) if name not in exposed}
    assert missing == set(), f"queried but not exposed by a live worker; it exposes {sorted(exposed)}"
    # The other way: every metric the worker exports is in METRIC_NAMES, the list the dashboard-or-alerts
    # test checks, so a metric added to the code and left off that list fails here, not silently.
    exported = {f.name + ("_total" if f.type == "counter" else "")
                for f in text_string_to_metric_families(page.text)
                if f.name.startswith("agentrun_") and not f.name.endswith("_created")}  # _created: a counter's start
    assert exported - set(METRIC_NAMES) == set(), "exported by the worker but not in METRIC_NAMES"
    assert set(METRIC_NAMES) - exported == set(), "in METRIC_NAMES but not exported by the worker"


def test_series_in_exposition_names_what_a_query_can_select() -> None:
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

    registry = CollectorRegistry()
    Counter("agentrun_claims", "claims", registry=registry).inc()
    Counter("agentrun_tool_errors", "errors", ["tool"], registry=registry)  # labelled, no sample yet
    Gauge("agentrun_runs", "runs", ["status"], registry=registry).labels("QUEUED").set(1)
    Histogram("agentrun_step_latency_seconds", "latency", registry=registry).observe(0.1)
    exposed = series_in_exposition(generate_latest(registry).decode())

    assert {"agentrun_claims_total", "agentrun_tool_errors_total", "agentrun_runs", "agentrun_step_latency_seconds_bucket",
            "agentrun_step_latency_seconds_count", "agentrun_step_latency_seconds_sum"} <= exposed
    # A query of these would select nothing: the check must flag them.
    assert not {"agentrun_claims", "agentrun_step_latency_seconds", "agentrun_runs_total", "agentrun_nope"} & exposed


def test_names_in_queries_keeps_suffixes() -> None:
    assert names_in_queries([
        'histogram_quantile(0.95, sum by (le) (rate(agentrun_step_latency_seconds_bucket{kind="MODEL"}[5m])))',
        "sum(increase(agentrun_claims_total[1h])) / sum(agentrun_runs)",
    ]) == {"agentrun_step_latency_seconds_bucket", "agentrun_claims_total", "agentrun_runs"}
