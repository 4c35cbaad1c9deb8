"""`agentrun agents …` and `runs submit --agent` against a real uvicorn server over a real database, with
a worker loop driving the runs; and hostile files and names: a message and exit status 1, no traceback."""

from __future__ import annotations

import io
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agentrun.worker.store import RunStore
from agentrun.worker.testing.scripted import TurnBasedLlm
from agentrun.worker.tools import ToolBox
from tests.support.builders import worker
from tests.support.cli import agentrun
from tests.support.running import running

pytestmark = pytest.mark.usefixtures("restore_logging")

AGENT_YAML = """\
name: researcher
description: Looks things up and reports what it found.
model: claude-haiku-4-5
system: |
  You are a careful researcher. Cite what you looked up.
tools: [noop]
maxSteps: 20
tokenBudget: 40000
timeoutSeconds: 300
"""


@pytest.fixture
async def driving(store: RunStore, toolbox: ToolBox) -> AsyncIterator[None]:
    async with running(worker(store, TurnBasedLlm(turns=1, tool="noop"), toolbox, poll=0.05)):
        yield


@pytest.mark.usefixtures("driving")
async def test_create_list_get_run_and_delete(
    server_url: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    url = ("--url", server_url)
    path = tmp_path / "agent.yaml"
    path.write_text(AGENT_YAML)
    code, out, err = await agentrun(capsys, "agents", "create", "-f", str(path), *url)
    assert (code, out.strip()) == (0, "agent researcher version 1 (created)"), err
    code, out, _ = await agentrun(capsys, "agents", "create", "-f", str(path), *url)
    assert out.strip() == "agent researcher version 1 (unchanged: identical to the latest version)"
    as_json = tmp_path / "agent.json"
    as_json.write_text(json.dumps({"name": "researcher", "system": "Be brief.", "tools": ["noop"],
                                   "tokenBudget": 40000, "timeoutSeconds": 300}))
    code, out, _ = await agentrun(capsys, "agents", "create", "-f", str(as_json), "--json", *url)
    assert json.loads(out) == {"name": "researcher", "version": 2}

    code, out, _ = await agentrun(capsys, "agents", "list", *url)
    header, row = out.splitlines()
    assert header.split()[:4] == ["NAME", "VERSION", "MODEL", "TOOLS"] and row.split()[:4] == [
        "researcher", "2", "-", "noop"]
    code, out, _ = await agentrun(capsys, "agents", "get", "researcher", "--version", "1", *url)
    assert "careful researcher" in out and "claude-haiku-4-5" in out
    code, out, _ = await agentrun(capsys, "agents", "get", "researcher", "--versions", *url)
    assert [line.split()[1] for line in out.splitlines()[1:]] == ["1", "2"]

    code, out, err = await agentrun(capsys, "runs", "submit", "what is new?", "--agent", "researcher@1", *url)
    assert code == 0, err
    run_id = out.split()[0]
    code, out, err = await agentrun(capsys, "runs", "watch", run_id, "--interval", "0.05", *url)
    assert code == 0, err
    code, out, _ = await agentrun(capsys, "runs", "get", run_id, "--json", *url)
    run = json.loads(out)
    assert (run["agent"], run["agentVersion"], run["tokenBudget"], run["maxSteps"], run["model"]) == (
        "researcher", 1, 40000, 20, "claude-haiku-4-5")
    code, out, _ = await agentrun(capsys, "runs", "get", run_id, *url)
    assert "researcher@1" in out

    # A limit above the agent's is refused, naming it; a lower one is taken.
    code, _, err = await agentrun(capsys, "runs", "submit", "x", "--agent", "researcher", "--budget", "50001", *url)
    assert code == 1 and "tokenBudget: may only lower agent researcher@2's 40000 (HTTP 422)" in err
    code, out, err = await agentrun(capsys, "runs", "submit", "x", "--agent", "researcher", "--budget", "100",
                                    "--sub-agent", "researcher@1", "--json", *url)
    assert code == 0, err
    code, out, _ = await agentrun(capsys, "runs", "get", json.loads(out)["id"], "--json", *url)
    assert (json.loads(out)["tokenBudget"], json.loads(out)["subAgents"]) == (100, ["researcher@1"])

    code, out, _ = await agentrun(capsys, "agents", "delete", "researcher", *url)
    assert (code, out.strip()) == (0, "agent researcher deleted")
    code, _, err = await agentrun(capsys, "runs", "submit", "x", "--agent", "researcher", *url)
    assert code == 1 and "agent: no agent 'researcher' (HTTP 404)" in err
    code, _, err = await agentrun(capsys, "agents", "get", "researcher", *url)
    assert code == 1 and "HTTP 404" in err
    code, out, _ = await agentrun(capsys, "agents", "list", *url)
    assert out.strip() == "no agents"


async def test_create_reads_stdin(
    server_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO('{"name": "from-stdin", "system": "hi"}'))
    code, out, err = await agentrun(capsys, "agents", "create", "-f", "-", "--url", server_url)
    assert (code, out.strip()) == (0, "agent from-stdin version 1 (created)"), err


HOSTILE: list[tuple[str | None, list[str], str]] = [
    ("name: [unclosed", [], "is not YAML or JSON"),
    ("- just\n- a list", [], "must be a mapping of its fields"),
    ("", [], "must be a mapping of its fields"),
    ("name: x\n1: one", [], "holds a value JSON cannot carry"),
    ("name: Bad_Name", [], "name: must be a DNS label"),
    ("name: x\ntools: [nope]", [], "tools[0]: unknown tool 'nope'"),
    ("name: x\nsubAgents: [x]", [], "names the agent itself"),
    ("name: x\nsubAgents: [ghost]", [], "no agent 'ghost' (HTTP 404)"),
    ("name: x\nsystem: \"nul \\0 here\"", [], "system: contains a NUL character"),
    ("name: x\ntokenBudget: -5", [], "tokenBudget: must be greater than 0"),
    ("name: x\nwhat: 1", [], "what: is not a known field"),
    (None, ["agents", "create", "-f", "/nonexistent/agent.yaml"], "cannot read the agent definition"),
    (None, ["agents", "get", "../../metrics"], "agent name '../../metrics' is not a DNS label"),
    (None, ["agents", "delete", "a?b=1"], "is not a DNS label"),
    (None, ["agents", "get", "\udcff"], "is not a DNS label"),
    (None, ["agents", "get", "nobody"], "no agent 'nobody' (HTTP 404)"),
    (None, ["agents", "get", "x", "--version", "0"], "--version: must be a positive integer, got 0"),
    (None, ["runs", "submit", "x", "--agent", "Bad@1"], "agent: names no agent"),
    (None, ["runs", "submit", "x", "--agent", "a@\udcff"], "agent: contains a lone surrogate"),
]


@pytest.mark.parametrize(("text", "argv", "says"), HOSTILE, ids=[repr(t or a)[:40] for t, a, _ in HOSTILE])
async def test_hostile_files_and_names_get_a_message(
    server_url: str, capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str | None, argv: list[str],
    says: str,
) -> None:
    if text is not None:
        path = tmp_path / "agent.yaml"
        path.write_text(text)
        argv = ["agents", "create", "-f", str(path)]
    try:
        code, out, err = await agentrun(capsys, *argv, "--url", server_url)
    except SystemExit as e:  # argparse refuses before any request
        code, err = int(e.code or 0), capsys.readouterr().err
    assert code in (1, 2), err
    assert says in err, err
    assert "Traceback" not in err
