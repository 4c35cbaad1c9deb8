"""Fixtures for the chart tests: a helm binary (obtained by scripts/get_helm.py) and cached renderings."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from tests.support.chart import CHART, NAMESPACE, RELEASE, Manifest, find_helm, run_helm


@pytest.fixture(scope="session")
def helm() -> str:
    path, reason = find_helm()
    if path is None:
        if os.environ.get("CI") == "true":  # in CI a missing helm must not hide the chart tests as skips
            pytest.fail(f"CI=true: {reason}")
        pytest.skip(reason)
    return path


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
