"""`agentrun replay …` against a real uvicorn server over a real database: it makes the replay, waits for its runs
(finished here through the database, as a worker would leave them), prints the table and the pass rate, and its
exit status gates on --fail-under; a timeout, a refusal and bad flags each have their own exit status."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import psycopg
import pytest

from agentrun.worker.store import RunStore
from tests.replays.conftest import recorded
from tests.replays.test_api import CALLS, finish
from tests.support.api import app, metrics, server_url, settings, toolbox  # noqa: F401  (fixtures)
from tests.support.cli import agentrun, restore_logging  # noqa: F401  (a fixture)
from tests.support.waiting import eventually

pytestmark = pytest.mark.usefixtures("restore_logging")


async def finish_replays_of(db: psycopg.AsyncConnection[Any], outcomes: dict[uuid.UUID, list[Any]]) -> None:
    """Wait for a replay run of each recorded run of `outcomes`, and end it with those tool calls."""
    left = dict(outcomes)

    async def done() -> bool:
        rows = await (await db.execute("SELECT id, replay_of FROM run WHERE replay_of = ANY(%s) AND status = 'QUEUED'",
                                       (list(left),))).fetchall()
        for run_id, replay_of in rows:
            await finish(db, run_id, left.pop(replay_of))
        return not left

    await eventually(done, 30, "the replay runs")


async def test_a_replay_below_the_rate_fails_the_command(
    server_url: str, store: RunStore, db: psycopg.AsyncConnection[Any],  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    a, b = await recorded(store, db, CALLS), await recorded(store, db, CALLS)
    finishing = asyncio.create_task(finish_replays_of(db, {a.id: CALLS, b.id: CALLS[:1]}))
    code, out, err = await agentrun(capsys, "replay", str(a.id), str(b.id), "--model", "claude-haiku-4-5",
                                    "--fail-under", "0.9", "--interval", "0.05", "--url", server_url)
    await finishing
    assert code == 3, (out, err)
    lines = out.splitlines()
    assert lines[0].startswith("replay ") and lines[0].endswith(": 2 runs")
    assert lines[1].split()[:4] == ["RECORDED", "RUN", "REPLAY", "RUN"]
    rows = {line.split()[0]: line.split() for line in lines[2:4]}
    assert rows[str(a.id)][2:6] == ["SUCCEEDED", "pass", "2→2", "0"]
    assert rows[str(b.id)][2:6] == ["SUCCEEDED", "FAIL", "2→1", "1"]
    assert "pass rate: 0.50 (1 of 2 judged)" in out and "COMPLETED" in out


async def test_a_replay_at_the_rate_passes_and_json_prints_the_report(
    server_url: str, store: RunStore, db: psycopg.AsyncConnection[Any],  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    a = await recorded(store, db, CALLS, labels={"team": "billing"})
    await recorded(store, db, CALLS, labels={"team": "ops"})
    finishing = asyncio.create_task(finish_replays_of(db, {a.id: CALLS}))
    code, out, err = await agentrun(capsys, "replay", "--selector", "team=billing", "--status", "succeeded",
                                    "--system", "be brief", "--fail-under", "1", "--json", "--interval", "0.05",
                                    "--url", server_url)
    await finishing
    assert code == 0, err
    report = json.loads(out)
    assert (report["status"], report["passRate"], report["runs"]) == ("COMPLETED", 1.0, 1)
    assert report["change"] == {"system": "be brief"} and report["selector"]["labels"] == "team=billing"

    code, out, err = await agentrun(capsys, "replay", "show", report["id"], "--fail-under", "1", "--url", server_url)
    assert code == 0 and "pass rate: 1.00 (1 of 1 judged)" in out, err
    code, out, err = await agentrun(capsys, "replay", "list", "--url", server_url)
    assert code == 0 and report["id"] in out and "system=…" in out, err
    replay_run = report["results"][0]["replayRunId"]
    code, out, err = await agentrun(capsys, "runs", "list", "--url", server_url)
    assert code == 0 and replay_run not in out and str(a.id) in out, err
    code, out, err = await agentrun(capsys, "runs", "list", "--replays", "--url", server_url)
    assert code == 0 and replay_run in out and str(a.id) in out, err
    code, out, err = await agentrun(capsys, "runs", "list", "--replay-id", report["id"], "--url", server_url)
    assert code == 0 and replay_run in out and str(a.id) not in out, err


async def test_a_replay_that_does_not_finish_in_time(
    server_url: str, store: RunStore, db: psycopg.AsyncConnection[Any],  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    a = await recorded(store, db, CALLS)
    code, out, err = await agentrun(capsys, "replay", str(a.id), "--wait-timeout", "0.3", "--interval", "0.05",
                                    "--fail-under", "0.5", "--url", server_url)
    assert code == 4, (out, err)
    assert "gave up waiting after 0.3s: 0 of 1 replay runs finished" in out


async def test_refusals_and_bad_flags(
    server_url: str, store: RunStore, db: psycopg.AsyncConnection[Any],  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _, err = await agentrun(capsys, "replay", str(uuid.uuid4()), "--url", server_url)
    assert code == 1 and "runs[0]" in err and "Traceback" not in err
    code, _, err = await agentrun(capsys, "replay", "--selector", "team=nobody", "--url", server_url)
    assert code == 1 and "selector: matches no finished run" in err
    code, _, err = await agentrun(capsys, "replay", "not-an-id", "--url", server_url)
    assert code == 1 and "is not a valid UUID" in err
    for argv, says in ((["--fail-under", "2"], "from 0 to 1"), (["--status", "running"], "SUCCEEDED"),
                       (["--tool-policy", "live"], "invalid choice")):
        with pytest.raises(SystemExit) as exited:
            await agentrun(capsys, "replay", str(uuid.uuid4()), *argv, "--url", server_url)
        assert exited.value.code == 2 and says in capsys.readouterr().err
    for argv, says in ((["replay"], "give RUN_IDs"), (["replay", str(uuid.uuid4()), "--selector", "a=b"], "one of them"),
                       (["replay", "show"], "one replay id")):
        with pytest.raises(SystemExit) as exited:
            await agentrun(capsys, *argv, "--url", server_url)
        assert says in str(exited.value.code)
