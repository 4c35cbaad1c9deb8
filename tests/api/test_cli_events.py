"""`agentrun events send KEY --payload JSON` against a real uvicorn server: it wakes the run waiting on KEY,
a retry with --idempotency-key wakes nobody twice, and a payload that is not JSON exits 2 saying so."""

from __future__ import annotations

import json

import pytest

from agentrun.worker.core.records import RunStatus
from agentrun.worker.store import RunStore
from agentrun.worker.testing.scripted import ScriptedLlm
from agentrun.worker.tools import ToolBox
from tests.support.builders import new_run, worker
from tests.support.cli import agentrun
from tests.support.running import finished, running
from tests.support.waiting import eventually

pytestmark = pytest.mark.usefixtures("restore_logging")


async def test_events_send_wakes_the_waiting_run_once(
    server_url: str, store: RunStore, toolbox: ToolBox, capsys: pytest.CaptureFixture[str]
) -> None:
    run, _ = await store.create(new_run(tools=("wait_for_event",)))
    llm = ScriptedLlm().then_tool_use("toolu_c", "wait_for_event", {"key": "deploy:3", "timeoutSeconds": 600})
    llm.then_text("deployed")
    async with running(worker(store, llm, toolbox)):
        async def parked() -> bool:
            found = await store.get(run.id)
            return found is not None and found.waiting_for == "event"

        await eventually(parked, 30, "the run waiting for its event")
        code, out, err = await agentrun(capsys, "runs", "get", str(run.id), "--url", server_url)
        assert code == 0 and "for an event" in out, err
        argv = ("events", "send", "deploy:3", "--payload", '{"ok": true}', "--idempotency-key", "d3", "--url",
                server_url)
        code, out, err = await agentrun(capsys, *argv)
        assert code == 0, err
        assert out.splitlines() == ["event deploy:3 woke 1 run", str(run.id)]
        code, out, err = await agentrun(capsys, *argv, "--json")
        assert code == 0 and json.loads(out) == {"woke": [str(run.id)]}
        done = await finished(store, run.id)
    assert done.status is RunStatus.SUCCEEDED
    assert [s.response for s in await store.steps(run.id) if s.tool_use_id == "toolu_c"] == ['{"ok":true}']
    code, out, err = await agentrun(capsys, "events", "send", "deploy:3", "--idempotency-key", "d3", "--url",
                                    server_url)
    assert code == 0 and "a retry" in out


async def test_a_payload_that_is_not_json_exits_2_saying_so(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        await agentrun(capsys, "events", "send", "k", "--payload", "{not json")
    assert exited.value.code == 2
    assert "--payload: not JSON" in capsys.readouterr().err


async def test_a_blank_key_is_refused_by_the_server(server_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = await agentrun(capsys, "events", "send", " ", "--url", server_url)
    assert code == 1 and "key" in err
