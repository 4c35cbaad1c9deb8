"""`--tenant` of the client commands: what a platform operator's identity makes, reads and lists is that
tenant's (against a real uvicorn server over a real database, whose open API acts as a platform operator)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrun.worker.store import RunStore
from tests.support.cli import agentrun

pytestmark = pytest.mark.usefixtures("restore_logging")


async def test_tenant_flag_of_runs_agents_schedules_and_events(
    server_url: str, store: RunStore, capsys: pytest.CaptureFixture[str], tmp_path: Path,
) -> None:
    url = ("--url", server_url)
    code, out, err = await agentrun(capsys, "runs", "submit", "hello", "--tenant", "team-b", "--json", *url)
    assert code == 0, err
    made = json.loads(out)["id"]
    code, _, err = await agentrun(capsys, "runs", "submit", "other", *url)
    assert code == 0, err
    code, out, err = await agentrun(capsys, "runs", "list", "--tenant", "team-b", "--json", *url)
    assert code == 0, err
    assert [r["id"] for r in json.loads(out)["items"]] == [made]

    (tmp_path / "helper.yaml").write_text("name: helper\nsystem: B's helper\n")
    code, _, err = await agentrun(capsys, "agents", "create", "-f", str(tmp_path / "helper.yaml"), "--tenant",
                                  "team-b", *url)
    assert code == 0, err
    code, out, _ = await agentrun(capsys, "agents", "list", "--json", *url)
    assert json.loads(out)["items"] == []  # the default tenant's: none
    code, out, err = await agentrun(capsys, "agents", "get", "helper", "--tenant", "team-b", "--json", *url)
    assert code == 0 and json.loads(out)["tenant"] == "team-b", err

    run = json.dumps({"input": "report", "tokenBudget": 1000, "timeoutSeconds": 60})
    code, _, err = await agentrun(capsys, "schedules", "create", "nightly", "--interval-seconds", "3600", "--run",
                                  run, "--tenant", "team-b", *url)
    assert code == 0, err
    assert await store.schedule("nightly", "team-b") is not None and await store.schedule("nightly") is None
    code, _, err = await agentrun(capsys, "schedules", "suspend", "nightly", "--tenant", "team-b", *url)
    assert code == 0, err
    found = await store.schedule("nightly", "team-b")
    assert found is not None and found.suspend

    code, _, err = await agentrun(capsys, "events", "send", "deploy", "--tenant", "team-b", *url)
    assert code == 0, err
    async with store.pool.connection() as conn:
        rows = await (await conn.execute("SELECT tenant FROM run_event")).fetchall()
    assert rows == [("team-b",)]
    code, _, err = await agentrun(capsys, "runs", "submit", "x", "--tenant", "Team B", *url)
    assert code == 1 and "tenant" in err and "Traceback" not in err
