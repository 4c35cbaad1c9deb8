"""Static checks in the suite: mypy --strict on both packages and ruff on the repo, as `make test` runs them."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
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


# One mypy run per session, whichever process starts it: with pytest-xdist each worker collects the
# test but only one runs it, so the run is a process of its own that leaves its verdict in files, in a
# directory the session (or the xdist controller, for all its workers) makes.
_WRAPPER = """
import os, subprocess, sys
out, rc, *command = sys.argv[1:]
with open(out, "wb") as f:
    code = subprocess.call(command, stdout=f, stderr=subprocess.STDOUT)
with open(rc + ".part", "w") as f:
    f.write(str(code))
os.replace(rc + ".part", rc)
"""
MYPY_DIR_KEY = "agentrun_mypy_dir"
_dirs: dict[int, Path] = {}


def mypy_dir(config: pytest.Config) -> Path:
    """The session's directory for the mypy run: the controller's under xdist, else this process's own."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and MYPY_DIR_KEY in workerinput:
        return Path(workerinput[MYPY_DIR_KEY])
    if id(config) not in _dirs:
        _dirs[id(config)] = Path(tempfile.mkdtemp(prefix="agentrun-mypy-"))
    return _dirs[id(config)]


def start_mypy(config: pytest.Config) -> None:
    """Start mypy in the background, at a low priority: tests/conftest.py calls this once the session has
    collected this test, so a cold check (a fresh clone has no cache; over a minute on 2 cores) runs
    beside the rest of the suite instead of after it. The test then waits for its verdict."""
    if importlib.util.find_spec("mypy") is None:
        return
    where = mypy_dir(config)
    try:
        (where / "claimed").mkdir()  # atomic: the first process to get here starts it
    except FileExistsError:
        return
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRAPPER, str(where / "out"), str(where / "rc"),
         sys.executable, str(ROOT / "scripts" / "typecheck.py")],
        cwd=ROOT, stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=lambda: os.nice(10),
    )
    (where / "pid").write_text(str(proc.pid))


def stop_mypy(config: pytest.Config) -> None:
    """At the end of the session (the controller's, under xdist): a check nobody waited for (the test
    deselected or never reached) ends."""
    if getattr(config, "workerinput", None) is not None or id(config) not in _dirs:
        return
    where = _dirs.pop(id(config))
    if (where / "pid").exists() and not (where / "rc").exists():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(int((where / "pid").read_text()), signal.SIGKILL)
    shutil.rmtree(where, ignore_errors=True)


@pytest.mark.skipif(_missing("mypy"), reason="mypy is not installed: pip install -e '.[test]'")
def test_packages_pass_mypy_strict(request: pytest.FixtureRequest) -> None:
    # The script maps agentrun.worker/agentrun.operator onto their folders; its cache in .mypy_cache
    # keeps a run after the first one to about a second.
    start_mypy(request.config)  # if the session did not start it already
    rc = mypy_dir(request.config) / "rc"
    deadline = time.monotonic() + 600
    while not rc.exists():
        assert time.monotonic() < deadline, "mypy gave no verdict in 600 s"
        time.sleep(0.2)
    text = (rc.parent / "out").read_bytes().decode(errors="replace")
    assert rc.read_text() == "0", f"mypy --strict found problems:\n{text}"


@pytest.mark.skipif(_missing("ruff"), reason="ruff is not installed: pip install -e '.[test]'")
def test_ruff_finds_nothing() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-fix", "--output-format", "concise", str(ROOT)],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )
    assert out.returncode == 0, f"ruff check found problems:\n{out.stdout}{out.stderr}"
