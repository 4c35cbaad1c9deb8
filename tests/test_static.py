"""Static checks in the suite: mypy --strict on both packages and ruff on the repo, as `make test` runs them."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _missing(module: str) -> bool:
    """Not installed; under CI=true (.ci/run sets it) a missing checker is an error, not a skip."""
    if importlib.util.find_spec(module) is None:
        if os.environ.get("CI") == "true":
            raise RuntimeError(f"CI=true: {module} is not installed (pip install -e '.[test]')")
        return True
    return False


_mypy: tuple[subprocess.Popen[bytes], Any] | None = None


def start_mypy() -> None:
    """Start mypy in the background, at a low priority: tests/conftest.py calls this once the session has
    collected this test, so a cold check (a fresh clone has no cache; over a minute on 2 cores) runs
    beside the rest of the suite instead of after it. The test then waits for its verdict."""
    global _mypy
    if _mypy is None and importlib.util.find_spec("mypy") is not None:
        out = tempfile.TemporaryFile()
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "scripts" / "typecheck.py")], stdout=out, stderr=subprocess.STDOUT,
            cwd=ROOT, preexec_fn=lambda: os.nice(10),
        )
        _mypy = (proc, out)


def stop_mypy() -> None:
    """At the end of the session: a check nobody waited for (the test deselected or never reached) ends."""
    if _mypy is not None and _mypy[0].poll() is None:
        _mypy[0].kill()
        _mypy[0].wait()


@pytest.mark.skipif(_missing("mypy"), reason="mypy is not installed: pip install -e '.[test]'")
def test_packages_pass_mypy_strict() -> None:
    # The script maps agentrun.worker/agentrun.operator onto their folders; its cache in .mypy_cache
    # keeps a run after the first one to about a second.
    start_mypy()  # if the session did not start it already
    assert _mypy is not None
    proc, out = _mypy
    returncode = proc.wait(timeout=600)
    out.seek(0)
    text = out.read().decode(errors="replace")
    assert returncode == 0, f"mypy --strict found problems:\n{text}"


@pytest.mark.skipif(_missing("ruff"), reason="ruff is not installed: pip install -e '.[test]'")
def test_ruff_finds_nothing() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-fix", "--output-format", "concise", str(ROOT)],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )
    assert out.returncode == 0, f"ruff check found problems:\n{out.stdout}{out.stderr}"
