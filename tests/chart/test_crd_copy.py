"""Helm's crds/ folder holds the same AgentRun CRD as the repository's crds/ (one source of truth)."""

from __future__ import annotations

import yaml

from tests.support.chart import CHART, ROOT

TOP_LEVEL = ROOT / "crds" / "agentrun.yaml"
CHART_COPY = CHART / "crds" / "agentrun.yaml"


def test_chart_crd_equals_the_top_level_crd() -> None:
    # A missing file fails here (FileNotFoundError names it), never skips.
    assert CHART_COPY.read_bytes() == TOP_LEVEL.read_bytes(), (
        "charts/agentrun/crds/agentrun.yaml differs from crds/agentrun.yaml: cp crds/agentrun.yaml charts/agentrun/crds/"
    )


def test_chart_crd_defines_agentrun() -> None:
    crd = yaml.safe_load(CHART_COPY.read_text())
    spec = crd["spec"]
    assert crd["metadata"]["name"] == "agentruns.agentrun.dev"
    assert (spec["group"], spec["scope"]) == ("agentrun.dev", "Namespaced")
    assert spec["names"]["kind"] == "AgentRun" and spec["names"]["plural"] == "agentruns"
    assert "ar" in spec["names"]["shortNames"]
    version = next(v for v in spec["versions"] if v["name"] == "v1alpha1")
    assert version["served"] and version["storage"] and "status" in version["subresources"]
