"""The dashboard and the alert rules query only metrics the worker exports (issue 4's names)."""

from __future__ import annotations

import importlib
import inspect
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.chart.conftest import CHART, CI_VALUES, Manifest, find
from tests.chart.metric_names import CHART_METRICS, names_in_exposition, names_in_queries, names_in_registry

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


def test_dashboard_and_rules_use_only_the_listed_metrics(render: Callable[..., list[Manifest]]) -> None:
    used = names_in_queries(dashboard_queries() + rule_queries(render))
    assert used - CHART_METRICS == set(), "add these to CHART_METRICS (and make sure the worker exports them)"
    # And the list holds no stale names the chart no longer queries.
    assert CHART_METRICS - used == set()


def test_rules_cover_the_four_alerts(render: Callable[..., list[Manifest]]) -> None:
    rule = find(render(_everything()), "PrometheusRule")
    alerts = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    assert set(alerts) == {"AgentrunRunsFailing", "AgentrunCostPerRunHigh", "AgentrunRunsStuck",
                           "AgentrunLeaseTakeoversSpiking"}
    for alert in alerts.values():
        assert alert["labels"]["severity"] in ("warning", "critical")
        assert alert["annotations"]["summary"]


def _worker_metric_names() -> set[str]:
    """Names exported by agentrun.worker.metrics, however it exposes them (a registry, a class taking
    one, or module-level metrics)."""
    try:
        module = importlib.import_module("agentrun.worker.metrics")
    except ModuleNotFoundError:
        pytest.skip("agentrun.worker.metrics does not exist yet (issue 4); the lead wires this check at merge")
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics import MetricWrapperBase

    declared = getattr(module, "METRIC_NAMES", None)
    if declared:
        return set(declared)
    for _, obj in inspect.getmembers(module):
        if isinstance(obj, CollectorRegistry):
            return names_in_registry(obj)
    for _, obj in inspect.getmembers(module, inspect.isclass):
        if obj.__module__ == module.__name__ and "registry" in inspect.signature(obj).parameters:
            registry = CollectorRegistry()
            try:
                obj(registry=registry)
            except TypeError:
                continue
            return names_in_registry(registry)
    registry = CollectorRegistry()
    found = [m for _, m in inspect.getmembers(module) if isinstance(m, MetricWrapperBase)]
    for metric in found:
        registry.register(metric)
    if not found:
        pytest.skip("agentrun.worker.metrics exposes no registry, metric class or metrics this test can read")
    return names_in_registry(registry)


def test_worker_exports_every_metric_the_chart_uses() -> None:
    exported = _worker_metric_names()
    assert CHART_METRICS - exported == set(), f"the worker exports {sorted(exported)}"


def test_names_in_exposition_reads_counters_gauges_and_histograms() -> None:
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

    registry = CollectorRegistry()
    Counter("agentrun_claims", "claims", registry=registry).inc()
    Gauge("agentrun_runs", "runs", ["status"], registry=registry).labels("QUEUED").set(1)
    Histogram("agentrun_step_latency_seconds", "latency", registry=registry).observe(0.1)
    assert {"agentrun_claims_total", "agentrun_runs", "agentrun_step_latency_seconds"} <= names_in_registry(registry)
    assert names_in_exposition("# TYPE agentrun_runs gauge\nagentrun_runs 1\n") == {"agentrun_runs"}
