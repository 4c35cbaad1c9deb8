"""`agentrun runs …` against a real uvicorn server, with a worker loop driving the runs it submits."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator

import pytest

from agentrun.worker import cli
from agentrun.worker.store import RunStore
from agentrun.worker.testing.scripted import TurnBasedLlm
from agentrun.worker.tools import ToolBox
from tests.support.builders import worker
from tests.support.cli import agentrun
from tests.support.running import running

pytestmark = pytest.mark.usefixtures("restore_logging")


@pytest.fixture
async def driving(store: RunStore, toolbox: ToolBox) -> AsyncIterator[None]:
    """A worker loop claiming and driving runs for the length of the test."""
    async with running(worker(store, TurnBasedLlm(turns=2, tool="noop", in_=812, out=64), toolbox, poll=0.05)):
        yield


@pytest.mark.usefixtures("driving")
async def test_submit_watch_timeline_get_list(server_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = await agentrun(capsys, "runs", "submit", "Which acme tickets are overdue?", "--url", server_url,
                                  "--tool", "noop", "--budget", "50000", "--timeout", "300", "--max-steps", "20")
    assert code == 0
    run_id, status = out.split()
    uuid.UUID(run_id)
    assert status == "QUEUED"

    code, out, err = await agentrun(capsys, "runs", "watch", run_id, "--url", server_url, "--interval", "0.05")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split()[:4] == ["SEQ", "KIND", "TOOL", "STATUS"]
    assert any(line.split()[:2] == ["1", "MODEL"] for line in lines)
    assert any(line.split()[:4] == ["5", "MODEL", "-", "DONE"] for line in lines)
    assert lines[-2].startswith(f"run {run_id} SUCCEEDED tokens=")
    assert lines[-1] == "done after 2 turns"  # the answer follows the run's last line

    code, out, _ = await agentrun(capsys, "runs", "timeline", run_id, "--url", server_url)
    assert code == 0
    claimable, *rows = out.splitlines()
    assert claimable.startswith("claimable from 20")  # the run's runAt
    assert rows[0].split() == ["SEQ", "KIND", "TOOL", "STATUS", "STOP", "IN", "OUT", "CACHE", "W/R", "LATENCY", "WORKER"]
    assert [r.split()[:4] for r in rows[1:]] == [
        ["1", "MODEL", "-", "DONE"], ["2", "TOOL", "noop", "DONE"], ["3", "MODEL", "-", "DONE"],
        ["4", "TOOL", "noop", "DONE"], ["5", "MODEL", "-", "DONE"]]
    assert rows[1].split()[4:8] == ["tool_use", "812", "64", "0/0"] and rows[1].split()[-1] == "worker-A"
    assert len({r.index("DONE") for r in rows[1:]}) == 1  # aligned

    code, out, _ = await agentrun(capsys, "runs", "timeline", run_id, "--url", server_url, "--json")
    assert [s["seq"] for s in json.loads(out)] == [1, 2, 3, 4, 5]

    code, out, _ = await agentrun(capsys, "runs", "get", run_id, "--url", server_url)
    assert code == 0 and "SUCCEEDED" in out and "Which acme tickets are overdue?" in out
    assert "\npriority   0\n" in out and "\nclaimable  20" in out

    code, out, _ = await agentrun(capsys, "runs", "list", "--url", server_url, "--status", "SUCCEEDED")
    assert code == 0 and run_id in out

    code, out, err = await agentrun(capsys, "runs", "cancel", run_id, "--url", server_url)
    assert code == 1 and "already finished" in err and "Traceback" not in err


async def test_cancel_and_watch_a_run_that_does_not_succeed(server_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = await agentrun(capsys, "runs", "submit", "never driven", "--url", server_url, "--json",
                                  "--idempotency-key", "k-1")
    run_id = json.loads(out)["id"]
    code, out, _ = await agentrun(capsys, "runs", "submit", "never driven", "--url", server_url, "--json",
                                  "--idempotency-key", "k-1")
    assert json.loads(out)["id"] == run_id
    code, out, _ = await agentrun(capsys, "runs", "cancel", run_id, "--url", server_url)
    assert code == 0 and out.strip() == f"{run_id} CANCELLED"
    code, out, _ = await agentrun(capsys, "runs", "watch", run_id, "--url", server_url)
    assert code == 1 and "CANCELLED" in out.splitlines()[-1]


async def test_errors_print_the_servers_message(
    server_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _, err = await agentrun(capsys, "runs", "submit", "x", "--url", server_url, "--tool", "rm_rf")
    assert code == 1 and "unknown tool 'rm_rf'" in err and "HTTP 422" in err and "Traceback" not in err
    code, _, err = await agentrun(capsys, "runs", "get", "not-a-uuid", "--url", server_url)
    assert code == 1 and "not a valid UUID" in err
    code, _, err = await agentrun(capsys, "runs", "get", str(uuid.uuid4()), "--url", server_url)
    assert code == 1 and "no run with id" in err and "HTTP 404" in err
    monkeypatch.setenv("AGENTRUN_URL", "http://127.0.0.1:9")
    code, _, err = await agentrun(capsys, "runs", "list")
    assert code == 1 and "cannot reach http://127.0.0.1:9" in err


async def test_token_from_the_environment(store: RunStore, toolbox: ToolBox, capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from agentrun.worker.obs.metrics import Metrics
    from agentrun.worker.settings import WorkerSettings
    from tests.support.api import make_app
    from tests.support.serving import serving

    app = make_app(store, toolbox, WorkerSettings(database_url="unused", api_token="t0ken-abc"), Metrics())
    async with serving(app) as url:
        monkeypatch.setenv("AGENTRUN_URL", url)
        code, _, err = await agentrun(capsys, "runs", "list")
        assert code == 1 and "HTTP 401" in err and "t0ken-abc" not in err
        monkeypatch.setenv("AGENTRUN_API_TOKEN", "t0ken-abc")
        code, out, _ = await agentrun(capsys, "runs", "list", "--json")
        assert code == 0 and json.loads(out) == {"items": [], "next": None}


@pytest.mark.parametrize("command", ["submit", "get", "timeline", "cancel", "watch", "list", "message"])
def test_every_runs_command_says_what_it_does_and_reads(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit:
        cli.main(["runs", command, "--help"])
    assert exit.value.code == 0
    out = capsys.readouterr().out
    assert "AGENTRUN_URL" in out and "AGENTRUN_API_TOKEN" in out


async def test_submit_with_priority_and_delay(server_url: str, store: RunStore, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = await agentrun(capsys, "runs", "submit", "later", "--url", server_url, "--priority", "7",
                                    "--delay", "2h", "--json")
    assert code == 0, err
    run = await store.get(uuid.UUID(json.loads(out)["id"]))
    assert run is not None and run.priority == 7 and run.run_at is not None
    assert abs((run.run_at - run.created_at).total_seconds() - 7200) < 1
    with pytest.raises(SystemExit) as exit:
        await agentrun(capsys, "runs", "submit", "x", "--url", server_url, "--delay", "soon")
    assert exit.value.code == 2 and "not a duration" in capsys.readouterr().err
    code, _, err = await agentrun(capsys, "runs", "submit", "x", "--url", server_url, "--priority", "10000000")
    assert code == 1 and "priority" in err
