"""The README's first command, end to end: the best smoke test of the whole product."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.slow
def test_demo_survives_kill_9_and_pays_the_first_model_call_once() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "agentrun.worker.cli", "demo"], capture_output=True, text=True, timeout=240,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout
    assert "worker-A killed with kill -9" in text
    assert "worker-B run=" in text and "resumed at seq=2" in text
    assert "(attempt 2)" in text  # the tool ran again, with the same key
    assert "SUCCEEDED" in text and "the model server saw it 1 time" in text
    assert "leaving 1 recorded effect" in text
    assert "Traceback" not in out.stderr and "\033[" not in text  # plain text when not on a terminal
