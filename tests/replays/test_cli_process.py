"""The CI recipe end to end: runs recorded by a real `agentrun worker` process that call a non-idempotent tool on
the local model server, then `agentrun replay … --model <another> --fail-under RATE` against that worker's API.
The replay runs to COMPLETED, the report compares the outputs and the calls, the execution log proves no tool ran
during the replay, and --fail-under sets the exit status."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrun.worker.core.records import RunStatus
from agentrun.worker.store import RunStore
from agentrun.worker.testing.fake_server import FakeAnthropic
from tests.replays.model import RECORDED_MODEL, REPLAY_MODEL, PlanResponder, plan
from tests.replays.tools import executed, worker_env
from tests.support.builders import new_run
from tests.support.cli import agentrun, restore_logging  # noqa: F401  (a fixture)
from tests.support.ports import free_port
from tests.support.processes import start_worker, stop, wait_ready
from tests.support.running import finished

pytestmark = pytest.mark.usefixtures("restore_logging")

TOOLS = ("charge", "lookup", "notify")


async def test_replay_in_ci_gates_on_the_pass_rate_and_runs_no_tool(
    store: RunStore, database_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    log = tmp_path / "executed.log"
    async with FakeAnthropic(PlanResponder()) as api:
        port = free_port()
        worker = await start_worker(port, "--id", "ci-1", "--concurrency", "4", "--poll-interval", "0.1",
                                    "--no-migrate", env=worker_env(database_url, api.base_url, log))
        url = f"http://127.0.0.1:{port}"
        try:
            await wait_ready(url, worker)
            charges = [plan(("charge", {"amount": n, "to": "bob"}), ("lookup", {"q": f"receipt {n}"}))
                       for n in (5, 7)]
            # The other model also tells someone, a call the recording does not have: blocked, and a fail.
            chatty = plan(("charge", {"amount": 9, "to": "ann"}), extra={REPLAY_MODEL: [("notify", {"who": "ann"})]})
            ids = []
            for text in (*charges, chatty):
                run, _ = await store.create(new_run(text, model=RECORDED_MODEL, tools=TOOLS, labels={"team": "billing"}))
                done = await finished(store, run.id, 60)
                assert done.status is RunStatus.SUCCEEDED, done.error
                ids.append(str(run.id))
            recorded_log = executed(str(log))
            assert len(recorded_log) == 5 and sum(line.startswith("charge ") for line in recorded_log) == 3

            code, out, err = await agentrun(capsys, "replay", "--selector", "team=billing", "--model", REPLAY_MODEL,
                                            "--fail-under", "0.9", "--interval", "0.1", "--wait-timeout", "120",
                                            "--url", url)
            assert code == 3, (out, err)  # 2 of 3: below 0.9
            assert "pass rate: 0.67 (2 of 3 judged)" in out and "COMPLETED" in out
            rows = {line.split()[0]: line.split() for line in out.splitlines() if line.split()[:1] and
                    line.split()[0] in ids}
            assert [rows[i][2:6] for i in ids] == [
                ["SUCCEEDED", "pass", "2→2", "0"], ["SUCCEEDED", "pass", "2→2", "0"], ["SUCCEEDED", "FAIL", "1→2", "1"]]
            assert executed(str(log)) == recorded_log  # nothing ran during the replay: every result was recorded

            code, out, err = await agentrun(capsys, "replay", *ids, "--model", REPLAY_MODEL, "--scorer", "exact",
                                            "--fail-under", "0", "--json", "--interval", "0.1", "--url", url)
            assert code == 0, err
            report = json.loads(out)
            assert report["status"] == "COMPLETED" and report["passRate"] == 0.0  # the answers name the model
            first = report["results"][0]["diff"]["output"]
            assert first["recorded"] == f"{RECORDED_MODEL}: charged 5 to bob | found receipt 5"
            assert first["replayed"] == f"{REPLAY_MODEL}: charged 5 to bob | found receipt 5"  # served, not run
            assert executed(str(log)) == recorded_log
        finally:
            await stop(worker)
