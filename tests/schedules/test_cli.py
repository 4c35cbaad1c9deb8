"""`agentrun schedules …` against a real uvicorn server over a real database; bad input is a message and exit
status 1, no traceback."""

from __future__ import annotations

import json

import pytest

from tests.support.cli import agentrun

pytestmark = pytest.mark.usefixtures("restore_logging")
RUN = '{"input": "report", "tokenBudget": 1000, "timeoutSeconds": 60}'


async def test_create_list_get_suspend_resume_delete(server_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    url = ("--url", server_url)
    code, out, err = await agentrun(capsys, "schedules", "create", "nightly", "--cron", "0 3 * * *", "--timezone",
                                    "Europe/Berlin", "--run", RUN, "--concurrency-policy", "Forbid", *url)
    assert code == 0 and out.startswith("schedule nightly created; next tick 20"), err
    code, out, err = await agentrun(capsys, "schedules", "create", "often", "--interval-seconds", "30", "--run",
                                    RUN, "--suspend", "--json", *url)
    assert code == 0 and json.loads(out)["suspend"] is True, err
    code, out, _ = await agentrun(capsys, "schedules", "list", *url)
    header, *rows = out.splitlines()
    assert header.split() == ["NAME", "SCHEDULE", "SUSPEND", "LAST", "NEXT", "ACTIVE"]
    assert rows[0].startswith("nightly") and "Europe/Berlin" in rows[0] and rows[1].startswith("often")
    code, out, _ = await agentrun(capsys, "schedules", "get", "nightly", *url)
    assert "Forbid" in out and "0 3 * * *" in out
    code, out, _ = await agentrun(capsys, "schedules", "suspend", "nightly", "--json", *url)
    assert json.loads(out)["nextScheduleTime"] is None
    code, out, _ = await agentrun(capsys, "schedules", "resume", "nightly", *url)
    assert code == 0 and "resumed; next tick 20" in out
    code, out, _ = await agentrun(capsys, "schedules", "get", "nightly", "--runs", *url)
    assert out.strip() == "no runs yet"
    code, out, _ = await agentrun(capsys, "schedules", "delete", "nightly", *url)
    assert (code, out.strip()) == (0, "schedule nightly deleted")
    code, out, err = await agentrun(capsys, "schedules", "get", "nightly", *url)
    assert code == 1 and "no schedule" in err


async def test_bad_input_is_a_message(server_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    url = ("--url", server_url)
    for argv, says in [
        (("create", "x", "--cron", "61 * * * *", "--run", RUN), "cron"),
        (("create", "x", "--interval-seconds", "5", "--run", "{not json"), "--run is not JSON"),
        (("create", "x", "--interval-seconds", "5"), "needs --run"),
        (("create", "x", "--cron", "* * * * *", "--timezone", "Nowhere/Land", "--run", RUN), "timezone"),
        (("get", "../../api/runs"), "not a DNS label"),
    ]:
        code, out, err = await agentrun(capsys, "schedules", *argv, *url)
        assert code == 1 and says in err and "Traceback" not in err, (argv, err)
