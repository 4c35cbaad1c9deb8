"""Static checks in the suite: mypy --strict on both packages and ruff on the repo, as `make test` runs them."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _missing(module: str) -> bool:
    """Not installed; under CI=true (.ci/run sets it) a missing checker is an error, not a skip."""
    if importlib.util.find_spec(module) is None:
        if os.environ.get("CI") == "true":
            raise RuntimeError(f"CI=true: {module} is not installed (pip install -e '.[test]')")
        return True
    return False


@pytest.mark.skipif(_missing("mypy"), reason="mypy is not installed: pip install -e '.[test]'")
def test_packages_pass_mypy_strict() -> None:
    # The script maps agentrun.worker/agentrun.operator onto their folders; its cache in .mypy_cache
    # keeps a run after the first one to about a second.
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "typecheck.py")], capture_output=True, text=True, cwd=ROOT,
        timeout=600,
    )
    assert out.returncode == 0, f"mypy --strict found problems:\n{out.stdout}{out.stderr}"


@pytest.mark.skipif(_missing("ruff"), reason="ruff is not installed: pip install -e '.[test]'")
def test_ruff_finds_nothing() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-fix", "--output-format", "concise", str(ROOT)],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )
    assert out.returncode == 0, f"ruff check found problems:\n{out.stdout}{out.stderr}"
