"""The README's first command (and the site's home page's, docs/index.md), end to end: the best smoke test of
the whole product."""

from __future__ import annotations

import re
import signal
import subprocess
import sys

import httpx
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


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_demo_keep_stops_everything_it_started_on_a_signal(sig: signal.Signals) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentrun.worker.cli", "demo", "--keep"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        assert proc.stdout is not None
        url = None
        for line in proc.stdout:  # ends when the demo does; the demo itself is bounded by its timeouts
            if m := re.search(r"AGENTRUN_URL=(\S+)", line):
                url = m.group(1)
                break
        assert url, "the demo never said where it keeps serving"
        assert httpx.get(f"{url}/healthz", timeout=5).status_code == 200
        proc.send_signal(sig)
        rest = proc.communicate(timeout=60)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and "everything the demo started has been stopped" in rest
    with pytest.raises(httpx.TransportError):  # worker-B is gone with it
        httpx.get(f"{url}/healthz", timeout=5)
