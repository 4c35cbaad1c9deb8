"""GET /api/runs/{id}/steps/{seq} `sent`: a MODEL step's request as it was sent (system prompt, tool
definitions, messages), rebuilt by replay, equal to what the model client was given; null for other kinds.
And the timeline of a run that ended while a call waited for a person: that row is ABANDONED."""

from __future__ import annotations

from typing import Any

import httpx
import orjson

from agentrun.worker.store import RunStore
from agentrun.worker.testing.scripted import ScriptedLlm
from agentrun.worker.tools import ToolBox
from tests.support.builders import worker

RUN = {"input": "Which acme tickets are overdue?", "tokenBudget": 50_000, "timeoutSeconds": 300}


def _json(value: Any) -> Any:
    return orjson.loads(orjson.dumps(value))


async def test_each_model_steps_request_as_sent(client: httpx.AsyncClient, store: RunStore, toolbox: ToolBox) -> None:
    r = await client.post("/api/runs", json={**RUN, "system": "Be brief.", "tools": ["lookup"]})
    run_id = r.json()["id"]
    llm = ScriptedLlm().then_tool_use("toolu_01Ab", "lookup", {"q": "acme"}, in_=812, out=64).then_text("3", 10, 5)
    await worker(store, llm, toolbox).run_once()
    assert len(llm.seen) == 2
    for seq, request in ((1, llm.seen[0]), (3, llm.seen[1])):
        detail = (await client.get(f"/api/runs/{run_id}/steps/{seq}")).json()
        assert detail["kind"] == "MODEL"
        assert detail["sent"] == {"system": request.system, "tools": _json(request.tools),
                                  "messages": _json(request.messages)}, seq
    first = (await client.get(f"/api/runs/{run_id}/steps/1")).json()["sent"]
    assert first["system"] == "Be brief." and [t["name"] for t in first["tools"]] == ["lookup"]
    assert first["messages"] == [{"role": "user", "content": RUN["input"]}]
    last = (await client.get(f"/api/runs/{run_id}/steps/3")).json()["sent"]
    assert [m["role"] for m in last["messages"]] == ["user", "assistant", "user"]
    assert (await client.get(f"/api/runs/{run_id}/steps/2")).json()["sent"] is None


async def test_a_schema_runs_request_shows_the_answer_tool_and_instruction(
    client: httpx.AsyncClient, store: RunStore, toolbox: ToolBox
) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    run_id = (await client.post("/api/runs", json={**RUN, "tools": [], "outputSchema": schema})).json()["id"]
    llm = ScriptedLlm().then_tool_use("toolu_1", "final_answer", {"n": 3}, in_=10, out=5)
    await worker(store, llm, toolbox).run_once()
    sent = (await client.get(f"/api/runs/{run_id}/steps/1")).json()["sent"]
    assert sent == {"system": llm.seen[0].system, "tools": _json(llm.seen[0].tools),
                    "messages": _json(llm.seen[0].messages)}
    assert "final_answer" in (sent["system"] or "") and [t["name"] for t in sent["tools"]] == ["final_answer"]


async def test_a_call_waiting_in_a_cancelled_run_is_abandoned(
    client: httpx.AsyncClient, store: RunStore, toolbox: ToolBox
) -> None:
    body = {**RUN, "tools": ["lookup"], "requireApproval": ["lookup"]}
    run_id = (await client.post("/api/runs", json=body)).json()["id"]
    llm = ScriptedLlm().then_tool_use("toolu_01Ab", "lookup", {"q": "acme"}, in_=10, out=5)
    await worker(store, llm, toolbox).run_once()
    rows = (await client.get(f"/api/runs/{run_id}/timeline")).json()
    assert [(r["seq"], r["status"]) for r in rows] == [(1, "DONE"), (None, "WAITING")]
    assert (await client.post(f"/api/runs/{run_id}/cancel")).json()["status"] == "CANCELLED"
    rows = (await client.get(f"/api/runs/{run_id}/timeline")).json()
    assert [(r["seq"], r["status"]) for r in rows] == [(1, "DONE"), (None, "ABANDONED")]
    assert rows[1]["toolUseId"] == "toolu_01Ab" and rows[1]["decisions"][0]["decision"] is None
