"""Continue and fork over real HTTP and a real worker, and the run's answer: text, structured, corrected,
failed, and a schema that is no schema."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from agentrun.worker.core.types import LlmError
from agentrun.worker.runtime.runner import Worker
from agentrun.worker.store import RunStore
from agentrun.worker.testing.scripted import ScriptedLlm
from agentrun.worker.tools import ToolBox
from tests.support.api import make_app, status_is, submit
from tests.support.builders import worker
from tests.support.running import running
from tests.support.serving import serving


@contextlib.asynccontextmanager
async def api(store: RunStore, toolbox: ToolBox, settings: Any, metrics: Any) -> AsyncIterator[httpx.AsyncClient]:
    async with serving(make_app(store, toolbox, settings, metrics)) as url, httpx.AsyncClient(base_url=url) as c:
        yield c


class ByModel:
    """Scripted answers per model name, so a fork with another model is seen to call that one."""

    def __init__(self, **scripts: ScriptedLlm) -> None:
        self.scripts = scripts

    async def send(self, request: Any) -> Any:
        return await self.scripts[request.model].send(request)


async def _worker_for(store: RunStore, llm: Any, toolbox: ToolBox) -> Worker:
    return worker(store, llm, toolbox)


# -- the answer ----------------------------------------------------------------------------------------


async def test_the_answer_of_a_succeeded_run_is_its_output(
    store: RunStore, toolbox: ToolBox, settings: Any, metrics: Any
) -> None:
    llm = ScriptedLlm().then_response(_text_blocks(["Two tickets ", "are overdue."]))
    async with api(store, toolbox, settings, metrics) as client, running(worker(store, llm, toolbox)):
        run_id = await submit(client, input="Which acme tickets are overdue?")
        run = await status_is(client, run_id, "SUCCEEDED")
    assert run["output"] == "Two tickets are overdue."


async def test_a_failed_run_has_no_output(store: RunStore, toolbox: ToolBox, settings: Any, metrics: Any) -> None:
    llm = ScriptedLlm().then_fail(LlmError(400, None, "bad request"))
    async with api(store, toolbox, settings, metrics) as client, running(worker(store, llm, toolbox)):
        run = await status_is(client, await submit(client), "FAILED")
    assert run["output"] is None


SCHEMA = {"type": "object", "properties": {"overdue": {"type": "integer"}}, "required": ["overdue"],
          "additionalProperties": False}


async def test_a_structured_answer_is_the_json_value(
    store: RunStore, toolbox: ToolBox, settings: Any, metrics: Any
) -> None:
    llm = ScriptedLlm().then_tool_use("t_ans", "final_answer", {"overdue": 2}, 10, 5)
    async with api(store, toolbox, settings, metrics) as client, running(worker(store, llm, toolbox)):
        run_id = await submit(client, outputSchema=SCHEMA)
        run = await status_is(client, run_id, "SUCCEEDED")
    assert run["output"] == {"overdue": 2} and run["outputSchema"] == SCHEMA
    [request] = llm.seen
    assert any(t["name"] == "final_answer" and t["input_schema"] == SCHEMA for t in request.tools)
    assert request.system is not None and "final_answer" in request.system


async def test_an_invalid_answer_gets_one_corrective_turn(
    store: RunStore, toolbox: ToolBox, settings: Any, metrics: Any
) -> None:
    llm = (ScriptedLlm().then_tool_use("t_1", "final_answer", {"overdue": "two"}, 10, 5)
           .then_tool_use("t_2", "final_answer", {"overdue": 2}, 10, 5))
    async with api(store, toolbox, settings, metrics) as client, running(worker(store, llm, toolbox)):
        run = await status_is(client, await submit(client, outputSchema=SCHEMA), "SUCCEEDED")
    assert run["output"] == {"overdue": 2}
    told = llm.seen[1].messages[-1]["content"][0]
    assert told["is_error"] is True and "does not match the schema" in told["content"] and "(at /overdue)" in told["content"]


async def test_a_second_invalid_answer_fails_the_run(
    store: RunStore, toolbox: ToolBox, settings: Any, metrics: Any
) -> None:
    llm = (ScriptedLlm().then_tool_use("t_1", "final_answer", {"overdue": "two"})
           .then_tool_use("t_2", "final_answer", {"late": 2}))
    async with api(store, toolbox, settings, metrics) as client, running(worker(store, llm, toolbox)):
        run = await status_is(client, await submit(client, outputSchema=SCHEMA), "FAILED")
    assert "does not match outputSchema" in run["error"] and run["output"] is None


async def test_a_plain_text_answer_to_a_schema_is_corrected_then_failed(
    store: RunStore, toolbox: ToolBox, settings: Any, metrics: Any
) -> None:
    llm = ScriptedLlm().then_text("two of them").then_text("still two")
    async with api(store, toolbox, settings, metrics) as client, running(worker(store, llm, toolbox)):
        run = await status_is(client, await submit(client, outputSchema=SCHEMA), "FAILED")
    assert "without calling final_answer" in run["error"]
    assert "final_answer" in llm.seen[1].messages[-1]["content"]


@pytest.mark.parametrize("schema", [{"type": "integr"}, {"required": "overdue"}, {"properties": []}])
async def test_a_schema_that_is_no_json_schema_is_a_400(
    schema: Any, store: RunStore, toolbox: ToolBox, settings: Any, metrics: Any
) -> None:
    async with api(store, toolbox, settings, metrics) as client:
        r = await client.post("/api/runs", json={"input": "x", "tokenBudget": 10, "timeoutSeconds": 10,
                                                 "outputSchema": schema})
    assert r.status_code == 422 and r.json()["fields"][0]["field"] == "outputSchema"


# -- continue and fork ---------------------------------------------------------------------------------


async def test_continue_goes_on_with_the_whole_conversation(
    store: RunStore, toolbox: ToolBox, settings: Any, metrics: Any
) -> None:
    llm = (ScriptedLlm().then_tool_use("t_1", "lookup", {"q": "acme"}, 10, 5).then_text("2 overdue", 10, 5)
           .then_text("ACME-7 and ACME-9", 20, 6))
    async with api(store, toolbox, settings, metrics) as client, running(worker(store, llm, toolbox)):
        first = await submit(client, input="Which acme tickets are overdue?")
        await status_is(client, first, "SUCCEEDED")
        second = await submit(client, input="Which ones?", continueFrom=first)
        run = await status_is(client, second, "SUCCEEDED")
        timeline = (await client.get(f"/api/runs/{second}/timeline")).json()
    assert run["parentRunId"] == first and run["forkedAtSeq"] is None
    assert run["output"] == "ACME-7 and ACME-9" and run["tokensUsed"] == 26  # only its own step
    sent = llm.seen[-1].messages
    assert [m["role"] for m in sent] == ["user", "assistant", "user", "assistant", "user"]
    assert sent[0]["content"] == "Which acme tickets are overdue?" and sent[-1]["content"] == "Which ones?"
    assert [(r["kind"], r["inherited"]) for r in timeline] == [
        ("USER", True), ("MODEL", True), ("TOOL", True), ("MODEL", True), ("USER", False), ("MODEL", False)
    ]


async def test_continue_of_a_run_that_did_not_succeed_is_a_409(
    store: RunStore, toolbox: ToolBox, settings: Any, metrics: Any
) -> None:
    async with api(store, toolbox, settings, metrics) as client:
        queued = await submit(client)
        r = await client.post("/api/runs", json={"input": "more", "continueFrom": queued})
        assert r.status_code == 409
        r = await client.post("/api/runs", json={"input": "more", "continueFrom": str(uuid.uuid4())})
        assert r.status_code == 404


async def test_a_fork_of_a_failed_run_with_another_model(
    store: RunStore, toolbox: ToolBox, settings: Any, metrics: Any
) -> None:
    cheap = (ScriptedLlm().then_tool_use("t_1", "lookup", {"q": "acme"}, 10, 5)
             .then_fail(LlmError(400, None, "context too long")))
    strong = ScriptedLlm().then_text("found it", 30, 7)
    llm = ByModel(**{settings.default_model: cheap, "claude-opus-4-1": strong})
    async with api(store, toolbox, settings, metrics) as client, running(worker(store, llm, toolbox)):
        source = await submit(client)
        failed = await status_is(client, source, "FAILED")
        assert failed["steps"] == 2  # the model step and its tool; the next model call failed
        fork = await client.post("/api/runs", json={"forkFrom": {"runId": source, "seq": 2},
                                                    "model": "claude-opus-4-1"})
        assert fork.status_code == 201, fork.text
        run = await status_is(client, fork.json()["id"], "SUCCEEDED")
    assert run["parentRunId"] == source and run["forkedAtSeq"] == 2 and run["model"] == "claude-opus-4-1"
    assert run["tokenBudget"] == failed["tokenBudget"] and run["input"] == failed["input"]
    assert run["tokensUsed"] == 37 and run["output"] == "found it"
    [request] = strong.seen
    assert [m["role"] for m in request.messages] == ["user", "assistant", "user"]


async def test_a_fork_at_a_model_step_runs_its_tools_again_in_the_new_run(
    store: RunStore, toolbox: ToolBox, settings: Any, metrics: Any
) -> None:
    llm = ScriptedLlm().then_tool_use("t_1", "lookup", {"q": "acme"}).then_text("a").then_text("b")
    async with api(store, toolbox, settings, metrics) as client, running(worker(store, llm, toolbox)):
        source = await submit(client)
        await status_is(client, source, "SUCCEEDED")
        fork = (await client.post("/api/runs", json={"forkFrom": {"runId": source, "seq": 1}})).json()["id"]
        await status_is(client, fork, "SUCCEEDED")
        timeline = (await client.get(f"/api/runs/{fork}/timeline")).json()
    assert [(r["kind"], r["inherited"]) for r in timeline] == [("MODEL", True), ("TOOL", False), ("MODEL", False)]


async def test_forks_that_cannot_be(store: RunStore, toolbox: ToolBox, settings: Any, metrics: Any) -> None:
    llm = ScriptedLlm().then_text("a")
    async with api(store, toolbox, settings, metrics) as client, running(worker(store, llm, toolbox)):
        source = await submit(client)
        await status_is(client, source, "SUCCEEDED")
        for seq in (0, 2):
            r = await client.post("/api/runs", json={"forkFrom": {"runId": source, "seq": seq}})
            assert r.status_code in (400, 422) and "seq" in r.text
        r = await client.post("/api/runs", json={"forkFrom": {"runId": source, "seq": 1}, "input": "x"})
        assert r.status_code == 422 and "input" in r.text
        r = await client.post("/api/runs", json={"forkFrom": {"runId": str(uuid.uuid4()), "seq": 1}})
        assert r.status_code == 404


async def test_concurrent_forks_are_independent(store: RunStore, toolbox: ToolBox, settings: Any, metrics: Any) -> None:
    """Two forks of one run at its first step, made at once: each runs the tool and the model itself."""
    llm = (ScriptedLlm().then_tool_use("t_1", "lookup", {"q": "acme"}, 10, 5).then_text("a")
           .then_text("b").then_text("c"))
    async with api(store, toolbox, settings, metrics) as client, running(worker(store, llm, toolbox)):
        source = await submit(client)
        await status_is(client, source, "SUCCEEDED")
        forks = await asyncio.gather(*(client.post("/api/runs", json={"forkFrom": {"runId": source, "seq": 1}})
                                       for _ in range(2)))
        assert [f.status_code for f in forks] == [201, 201], [f.text for f in forks]
        ids = [f.json()["id"] for f in forks]
        runs = [await status_is(client, run_id, "SUCCEEDED") for run_id in ids]
        timelines = [(await client.get(f"/api/runs/{run_id}/timeline")).json() for run_id in ids]
        source_timeline = (await client.get(f"/api/runs/{source}/timeline")).json()
    assert len(set(ids)) == 2
    assert all(r["parentRunId"] == source and r["forkedAtSeq"] == 1 for r in runs)
    assert sorted(r["output"] for r in runs) == ["b", "c"]  # each fork made its own model call
    for timeline in timelines:
        assert [(r["kind"], r["inherited"]) for r in timeline] == [("MODEL", True), ("TOOL", False), ("MODEL", False)]
    assert [(r["kind"], r["inherited"]) for r in source_timeline] == [("MODEL", False), ("TOOL", False), ("MODEL", False)]


def _text_blocks(texts: list[str]) -> Any:
    from agentrun.worker.core.types import LlmResponse, Usage

    return LlmResponse([{"type": "text", "text": t} for t in texts], "end_turn", Usage(10, 5))
