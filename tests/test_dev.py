"""`agentrun dev` as a user runs it: start, a run through the API, the UI served, Ctrl-C, and a second start
on the same data directory that finds the first one's run."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from agentrun.worker.demo.dev import default_data_dir
from tests.support.ports import free_port

pytestmark = pytest.mark.slow


class Dev:
    def __init__(self, data: Path, port: int, **extra: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "AGENTRUN_"))} | extra
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agentrun.worker.cli", "dev", "--data-dir", str(data), "--port", str(port)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())

    def wait_for(self, text: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.lines):
            if self.proc.poll() is not None and not self.reader.is_alive():
                raise AssertionError(f"agentrun dev exited ({self.proc.returncode}): {self.lines[-20:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {text!r} in {timeout:g}s: {self.lines[-20:]}")
            time.sleep(0.05)

    def interrupt(self, timeout: float = 60) -> int:
        self.proc.send_signal(signal.SIGINT)  # what Ctrl-C sends
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        self.reader.join(10)
        return code


def test_dev_starts_serves_stops_and_keeps_its_runs(tmp_path: Path) -> None:
    data, port = tmp_path / "dev", free_port()
    url = f"http://127.0.0.1:{port}"
    first = Dev(data, port)
    try:
        first.wait_for(f"open {url}/ui/")
        with httpx.Client(base_url=url, timeout=30) as http:
            assert "agentrun" in http.get("/ui/").text
            run_id = http.post("/api/runs", json={"input": "Which acme tickets are overdue?", "tokenBudget": 50_000,
                                                  "timeoutSeconds": 300}).json()["id"]
            deadline = time.monotonic() + 60
            while (run := http.get(f"/api/runs/{run_id}").json())["status"] != "SUCCEEDED":
                assert time.monotonic() < deadline, run
                time.sleep(0.1)
            timeline = http.get(f"/api/runs/{run_id}/timeline").json()
            assert [s["toolName"] for s in timeline] == [None, "list_tickets", None]  # the demo tool
    finally:
        code = first.interrupt()
    assert code == 0, first.lines[-20:]
    assert any("stopped (worker, model server and database)" in line for line in first.lines)
    assert not any("Traceback" in line for line in first.lines), first.lines
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{url}/healthz", timeout=2)

    second = Dev(data, port)
    try:
        second.wait_for(f"open {url}/ui/")
        runs = httpx.get(f"{url}/api/runs", timeout=30).json()["items"]
        assert [r["id"] for r in runs] == [run_id] and runs[0]["status"] == "SUCCEEDED"
    finally:
        assert second.interrupt() == 0, second.lines[-20:]


def test_a_port_in_use_is_said_plainly(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = subprocess.run([sys.executable, "-m", "agentrun.worker.cli", "dev", "--data-dir", str(tmp_path),
                              "--port", str(port)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and f"port {port} on 127.0.0.1 is in use" in out.stderr and "Traceback" not in out.stderr


def test_the_default_data_directory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_data_dir() == tmp_path / ".local" / "share" / "agentrun" / "dev"


def cli(url: str, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agentrun.worker.cli", "runs", *argv, "--url", url],
                          capture_output=True, text=True, timeout=timeout)


def finished(http: httpx.Client, run_id: str, timeout: float = 90) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    while (run := http.get(f"/api/runs/{run_id}").json())["status"] not in ("SUCCEEDED", "FAILED", "TIMED_OUT",
                                                                            "CANCELLED"):
        assert time.monotonic() < deadline, run
        time.sleep(0.1)
    return dict(run)


def test_the_readme_examples_and_markers_against_dev(tmp_path: Path) -> None:
    """docs/getting-started/local.md's "Trying it by hand", as written, against `agentrun dev` with a worker's
    environment: the extra tool module and the MCP servers file are honoured; an output schema gets a valid answer; each
    marker does what the table says; `runs watch` on a waiting run says what to decide and how."""
    (tmp_path / "mcp.yaml").write_text("servers:\n  - name: shop\n    url: http://127.0.0.1:9/mcp\n")
    data, port = tmp_path / "dev", free_port()
    url = f"http://127.0.0.1:{port}"
    dev = Dev(data, port, AGENTRUN_TOOLS="tests.support.event_tools",
              AGENTRUN_MCP_SERVERS=str(tmp_path / "mcp.yaml"))
    try:
        dev.wait_for(f"open {url}/ui/")
        banner = next(line for line in dev.lines if "try:" in line).split("try:")[1].strip()
        command = banner.split(" runs submit")[0]
        assert subprocess.run(f"{command} --help", shell=True, capture_output=True, timeout=60).returncode == 0
        with httpx.Client(base_url=url, timeout=30) as http:
            tools = http.get("/api/tools").json()
            assert {"list_tickets", "lookup"} <= {t["name"] for t in tools["tools"]}
            assert [s["name"] for s in tools["servers"]] == ["shop"]

            schema = tmp_path / "count.json"
            schema.write_text('{"type":"object","properties":{"count":{"type":"integer"}},"required":["count"]}')
            out = cli(url, "submit", "How many acme tickets are overdue?", "--output-schema", str(schema),
                      "--label", "team=billing")
            assert out.returncode == 0, out.stderr
            structured = out.stdout.split()[0]
            run = finished(http, structured)
            assert run["status"] == "SUCCEEDED" and run["output"] == {"count": 0}, run

            failing = cli(url, "submit", "[[fail]]").stdout.split()[0]
            run = finished(http, failing)
            assert run["status"] == "FAILED" and "[[fail]]" in str(run["error"]), run

            looping = cli(url, "submit", "[[loop]]", "--max-steps", "5").stdout.split()[0]
            run = finished(http, looping)
            assert run["status"] == "FAILED" and run["steps"] <= 5 and "step" in str(run["error"]), run

            waiting = cli(url, "submit", "[[tool:list_tickets]] refund the overdue ones", "--require-approval",
                          "list_tickets").stdout.split()[0]
            watch = subprocess.Popen([sys.executable, "-m", "agentrun.worker.cli", "runs", "watch", waiting,
                                      "--url", url], stdout=subprocess.PIPE, text=True)
            assert watch.stdout is not None
            said: list[str] = []
            for line in watch.stdout:
                said.append(line)
                if "decide: " in line:
                    break
            assert any('waiting for a decision: list_tickets {"status": "overdue"}' in line for line in said), said
            decide = said[-1].split("decide: ")[1].split()
            assert decide[:4] == ["agentrun", "runs", "decide", waiting] and decide[-1] == "approve|deny"
            out = cli(url, "decide", waiting, decide[4], "approve")
            assert out.returncode == 0, out.stderr
            rest, _ = watch.communicate(timeout=120)
            assert watch.returncode == 0, said + [rest]
            assert f"run {waiting} SUCCEEDED" in rest and "None" not in "".join(said) + rest

            listed = cli(url, "list", "-l", "team=billing")
            assert listed.returncode == 0, listed.stderr
            rows = listed.stdout.splitlines()[1:]
            assert [r.split()[0] for r in rows] == [structured] and "team=billing" in rows[0]
            every = cli(url, "list", "--all", "--limit", "1").stdout.splitlines()[1:]
            assert sorted(r.split()[0] for r in every) == sorted([structured, failing, looping, waiting])
    finally:
        assert dev.interrupt() == 0, dev.lines[-20:]
    assert not any("Traceback" in line for line in dev.lines), dev.lines
