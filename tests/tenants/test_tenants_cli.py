"""`agentrun tenants …` against a real uvicorn server over a real database: set (flags not given keep their
value, `none` clears one), get and list; bad input is a message and exit status 1, no traceback."""

from __future__ import annotations

import json

import pytest

from tests.support.cli import agentrun

pytestmark = pytest.mark.usefixtures("restore_logging")


async def test_set_get_list_round_trip(server_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    url = ("--url", server_url)
    code, out, err = await agentrun(capsys, "tenants", "set", "team-a", "--max-running", "50", "--max-queued",
                                    "10000", "--tokens-per-day", "5e7", "--cost-per-day-usd", "200", "--weight", "1",
                                    "--json", *url)
    assert code == 0, err
    assert {k: v for k, v in json.loads(out).items() if k in ("maxRunning", "maxQueued", "tokensPerDay",
                                                                "costPerDayUsd", "weight")} == {
        "maxRunning": 50, "maxQueued": 10000, "tokensPerDay": 50_000_000, "costPerDayUsd": 200.0, "weight": 1.0}
    # A flag not given keeps its value; `none` clears one.
    code, out, err = await agentrun(capsys, "tenants", "set", "team-a", "--max-queued", "none", "--weight", "2.5",
                                    "--json", *url)
    assert code == 0, err
    got = json.loads(out)
    assert (got["maxRunning"], got["maxQueued"], got["tokensPerDay"], got["weight"]) == (50, None, 50_000_000, 2.5)
    code, out, _ = await agentrun(capsys, "tenants", "get", "team-a", *url)
    assert code == 0 and "max queued      none" in out and "tokens per day  50000000" in out
    code, out, _ = await agentrun(capsys, "tenants", "list", *url)
    header, *rows = out.splitlines()
    assert header.split()[:3] == ["NAME", "MAX-RUNNING", "MAX-QUEUED"]
    assert [r.split()[0] for r in rows] == ["default", "team-a"]


@pytest.mark.parametrize(("argv", "says"), [
    (("set", "team-a", "--max-queued", "-1"), "must be 0 or more"),
    (("set", "team-a", "--tokens-per-day", "1.5"), "whole number"),
    (("set", "team-a", "--max-running", "lots"), "not a number"),
    (("set", "team-a", "--weight", "0"), "at least 0.001"),
])
async def test_bad_flags_are_a_message(server_url: str, capsys: pytest.CaptureFixture[str], argv: tuple[str, ...],
                                       says: str) -> None:
    with pytest.raises(SystemExit) as exited:
        await agentrun(capsys, "tenants", *argv, "--url", server_url)
    assert exited.value.code == 2 and says in capsys.readouterr().err


async def test_server_refusals_are_a_message(server_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = await agentrun(capsys, "tenants", "get", "nobody", "--url", server_url)
    assert code == 1 and "no tenant 'nobody'" in err and "Traceback" not in err
    code, _, err = await agentrun(capsys, "tenants", "get", "../../api/runs", "--url", server_url)
    assert code == 1 and "not a DNS label" in err
