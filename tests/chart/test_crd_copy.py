"""Helm's crds/ folder holds the same CRDs as the repository's crds/ (one source of truth)."""

from __future__ import annotations

import pytest
import yaml

from tests.support.chart import CHART, ROOT

CRDS = ("agentrun.yaml", "agent.yaml", "agentschedule.yaml")


@pytest.mark.parametrize("name", CRDS)
def test_chart_crd_equals_the_top_level_crd(name: str) -> None:
    # A missing file fails here (FileNotFoundError names it), never skips.
    assert (CHART / "crds" / name).read_bytes() == (ROOT / "crds" / name).read_bytes(), (
        f"charts/agentrun/crds/{name} differs from crds/{name}: cp crds/{name} charts/agentrun/crds/"
    )


def test_the_chart_ships_every_crd() -> None:
    assert sorted(p.name for p in (CHART / "crds").glob("*.yaml")) == sorted(CRDS)
    assert sorted(p.name for p in (ROOT / "crds").glob("*.yaml")) == sorted(CRDS)


@pytest.mark.parametrize("name, kind, plural, short", [
    ("agentrun.yaml", "AgentRun", "agentruns", "ar"), ("agent.yaml", "Agent", "agents", "ag"),
    ("agentschedule.yaml", "AgentSchedule", "agentschedules", "as"),
])
def test_chart_crd_defines_its_kind(name: str, kind: str, plural: str, short: str) -> None:
    crd = yaml.safe_load((CHART / "crds" / name).read_text())
    spec = crd["spec"]
    assert crd["metadata"]["name"] == f"{plural}.agentrun.dev"
    assert (spec["group"], spec["scope"]) == ("agentrun.dev", "Namespaced")
    assert spec["names"]["kind"] == kind and spec["names"]["plural"] == plural
    assert short in spec["names"]["shortNames"]
    version = next(v for v in spec["versions"] if v["name"] == "v1alpha1")
    assert version["served"] and version["storage"] and "status" in version["subresources"]
