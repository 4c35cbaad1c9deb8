"""promtool and prometheus (Debian's `prometheus` package) for the alert and dashboard tests, and the
chart's rules and dashboard queries as those tools read them."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.chart import CHART, Manifest, find

RULES_VALUES = ("--set", "metrics.prometheusRule.enabled=true")


def require(tool: str) -> str:
    """The tool's path; skips saying why when it is missing, except under CI=true, where it fails."""
    path = os.environ.get(tool.upper()) or shutil.which(tool)
    if path:
        return path
    why = f"{tool} is not installed (Debian/Ubuntu: apt-get install prometheus)"
    if os.environ.get("CI") == "true":
        pytest.fail(f"{why}; under CI=true .ci/run installs it, so this must not be skipped")
    pytest.skip(why)


def rule_groups(manifests: list[Manifest]) -> dict[str, Any]:
    """The PrometheusRule's groups as a Prometheus rule file."""
    return {"groups": find(manifests, "PrometheusRule")["spec"]["groups"]}


def write_rules(manifests: list[Manifest], directory: Path) -> Path:
    path = directory / "rules.yaml"
    path.write_text(yaml.safe_dump(rule_groups(manifests), sort_keys=False))
    return path


def alert_exprs(manifests: list[Manifest]) -> dict[str, str]:
    return {r["alert"]: r["expr"] for g in rule_groups(manifests)["groups"] for r in g["rules"] if "alert" in r}


def _targets(panels: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    out = []
    for panel in panels:
        out.extend((panel.get("title", ""), panel, t) for t in panel.get("targets", []))
        out.extend(_targets(panel.get("panels", [])))  # panels inside collapsed rows
    return out


def dashboard() -> dict[str, Any]:
    return json.loads((CHART / "dashboards" / "agentrun.json").read_text())  # type: ignore[no-any-return]


def dashboard_promql(board: dict[str, Any] | None = None) -> dict[str, str]:
    """`title [refId]` → PromQL of every Prometheus target of the dashboard (Tempo targets left out)."""
    board = board or dashboard()
    out = {}
    for title, panel, target in _targets(board["panels"]):
        source = target.get("datasource") or panel.get("datasource") or {}
        if source.get("type") == "prometheus" and "expr" in target:
            out[f"{title} [{target.get('refId', '?')}]"] = target["expr"]
    return out


def concrete(expr: str, namespace: str, rate_interval: str = "30s") -> str:
    """A dashboard query as Grafana would send it for one namespace."""
    return expr.replace("$__rate_interval", rate_interval).replace('=~"$namespace"', f'=~"{namespace}"')


# `agentrun_x{...}` or a bare `agentrun_x`: each vector selector of a query.
SELECTOR = re.compile(r"\b(agentrun_[a-zA-Z0-9_]*[a-zA-Z0-9])(\{[^}]*\})?")


def selectors(expr: str) -> set[str]:
    return {name + (labels or "") for name, labels in SELECTOR.findall(expr)}
