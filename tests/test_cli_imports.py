"""`agentrun --help` and the REST client commands answer at once: they must not load the worker's heavy
dependencies. Checked on the modules a fresh process has imported when the command is done, not on wall
time, so it holds on a loaded machine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("mcp", "uvicorn", "anthropic", "fastapi", "starlette", "psycopg", "jsonschema", "openai", "botocore")
"""What the worker needs and a client command does not (each costs from a tenth of a second to seconds)."""

PROBE = """
import atexit, json, sys
atexit.register(lambda: open(sys.argv[1], "w").write(json.dumps(sorted(sys.modules))))
from agentrun.worker.cli.main import main
sys.exit(main(sys.argv[2:]))
"""


def imported(tmp_path: Path, *argv: str) -> set[str]:
    """The top-level packages a fresh `agentrun ARGV` process imported."""
    out = tmp_path / "modules.json"
    subprocess.run([sys.executable, "-c", PROBE, str(out), *argv], capture_output=True, timeout=120,
                   env={"PATH": "/usr/bin:/bin", "AGENTRUN_URL": "http://127.0.0.1:9"})
    return {m.split(".")[0] for m in json.loads(out.read_text())}


@pytest.mark.parametrize("argv", [
    ["--help"], ["runs", "--help"], ["runs", "submit", "--help"], ["worker", "--help"], ["dev", "--help"],
    ["runs", "submit", "hello", "--tool", "list_tickets"],  # the server (port 9) refuses: the client's imports alone
    ["runs", "list", "--status", "running", "-l", "team=billing"],
    ["runs", "watch", "00000000-0000-0000-0000-000000000001"],
])
def test_client_commands_import_nothing_heavy(tmp_path: Path, argv: list[str]) -> None:
    loaded = imported(tmp_path, *argv)
    assert "agentrun" in loaded
    assert not loaded & set(HEAVY), f"agentrun {' '.join(argv)} imported {sorted(loaded & set(HEAVY))}"


def test_the_probe_sees_heavy_imports(tmp_path: Path) -> None:
    """The check above can fail: a command that does load the worker's parts is seen doing so."""
    loaded = imported(tmp_path, "migrate", "--database-url", "postgresql://nobody@127.0.0.1:9/x")
    assert "psycopg" in loaded
