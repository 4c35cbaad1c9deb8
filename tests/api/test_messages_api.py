"""POST /api/runs/{id}/messages over the real app and database: 202 and its delivery, seen in the timeline
(USER with createdBy), the messages list, the run JSON and the events stream; every refusal named."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import httpx

from agentrun.worker.core.types import LlmRequest, LlmResponse, Usage
from agentrun.worker.store import RunStore
from agentrun.worker.tools import ToolBox
from tests.support.api import status_is, submit
from tests.support.builders import worker
from tests.support.running import running
from tests.support.sse import streaming


async def test_refusals_name_the_field_or_the_reason(client: httpx.AsyncClient, store: RunStore) -> None:
    run_id = await submit(client)
    for body, field in [({"text": ""}, "text"), ({"text": "   \n"}, "text"), ({}, "text"),
                        ({"text": "a\u0000b"}, "text"), ({"text": "x" * 100_001}, "text"), ({"text": 5}, "text"),
                        ({"text": "hi", "extra": 1}, "extra")]:
        r = await client.post(f"/api/runs/{run_id}/messages", json=body)
        assert r.status_code == 422, (body, r.text)
        assert field in [p["field"] for p in r.json()["fields"]], (body, r.json())
        assert "Traceback" not in r.text
    r = await client.post(f"/api/runs/{run_id}/messages", content=b"{not json",
                          headers={"Content-Type": "application/json"})
    assert r.status_code == 400
    r = await client.post(f"/api/runs/{uuid.uuid4()}/messages", json={"text": "hi"})
    assert r.status_code == 404 and "no run with id" in r.json()["error"]
    r = await client.get(f"/api/runs/{uuid.uuid4()}/messages")
    assert r.status_code == 404
    assert (await client.get(f"/api/runs/{run_id}/messages")).json() == []
    # A long message within the bound is taken whole.
    r = await client.post(f"/api/runs/{run_id}/messages", json={"text": "y" * 100_000})
    assert r.status_code == 202 and len(r.json()["text"]) == 100_000

    # Cancelled: refused, pointing to continueFrom.
    assert (await client.post(f"/api/runs/{run_id}/cancel")).status_code == 202
    r = await client.post(f"/api/runs/{run_id}/messages", json={"text": "still there?"})
    assert r.status_code == 409 and "CANCELLED" in r.json()["error"] and "continueFrom" in r.json()["error"]


async def test_a_message_to_a_finished_run_is_a_409_pointing_to_continue_from(
    client: httpx.AsyncClient, store: RunStore, toolbox: ToolBox
) -> None:
    from agentrun.worker.testing.scripted import ScriptedLlm

    run_id = await submit(client)
    async with running(worker(store, ScriptedLlm().then_text("done"), toolbox)):
        await status_is(client, run_id, "SUCCEEDED")
    r = await client.post(f"/api/runs/{run_id}/messages", json={"text": "and then?"})
    assert r.status_code == 409, r.text
    assert "SUCCEEDED" in r.json()["error"] and f'"continueFrom": "{run_id}"' in r.json()["error"]
    run = (await client.get(f"/api/runs/{run_id}")).json()
    assert (run["messagesSent"], run["messagesDelivered"]) == (0, 0)


class Gate:
    """A model whose first turn asks for `lookup` and waits on `proceed` first; then it answers."""

    def __init__(self) -> None:
        self.entered, self.proceed = asyncio.Event(), asyncio.Event()
        self.seen: list[LlmRequest] = []

    async def send(self, request: LlmRequest) -> LlmResponse:
        self.seen.append(request)
        if len(self.seen) == 1:
            self.entered.set()
            await self.proceed.wait()
            return LlmResponse([{"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"q": "x"}}],
                               "tool_use", Usage(1, 1))
        return LlmResponse([{"type": "text", "text": "noted"}], "end_turn", Usage(1, 1))


async def test_a_message_is_stored_at_once_and_delivered_as_a_user_step_seen_everywhere(
    store: RunStore, toolbox: ToolBox, server_url: str
) -> None:
    llm = Gate()
    async with httpx.AsyncClient(base_url=server_url, timeout=30) as http:
        run_id = await submit(http, tools=["lookup"])
        async with streaming(http, f"/api/runs/{run_id}/events") as stream, running(worker(store, llm, toolbox)):
            await asyncio.wait_for(llm.entered.wait(), 10)
            r = await http.post(f"/api/runs/{run_id}/messages", json={"text": "prefer the EU region"})
            assert r.status_code == 202, r.text
            posted = r.json()
            assert posted["n"] == 1 and posted["seq"] is None and posted["text"] == "prefer the EU region"
            assert posted["createdBy"] is None  # an open API
            listed = (await http.get(f"/api/runs/{run_id}/messages")).json()
            assert [m["text"] for m in listed] == ["prefer the EU region"]
            llm.proceed.set()
            await stream.until(lambda s: s.ended, what="the end")
        run = (await http.get(f"/api/runs/{run_id}")).json()
        assert run["status"] == "SUCCEEDED" and (run["messagesSent"], run["messagesDelivered"]) == (1, 1)
        timeline = (await http.get(f"/api/runs/{run_id}/timeline")).json()
        assert [s["kind"] for s in timeline] == ["MODEL", "TOOL", "USER", "MODEL"]
        user = timeline[2]
        assert user["seq"] == 3 and user["status"] == "DONE" and "createdBy" in user
        detail = (await http.get(f"/api/runs/{run_id}/steps/3")).json()
        assert detail["response"] == "prefer the EU region" and detail["request"] == "message"
        assert (await http.get(f"/api/runs/{run_id}/messages")).json()[0]["seq"] == 3
        # The events stream carried it: a step event of kind USER, in seq order with the others.
        steps = stream.of("step")
        assert any(s["kind"] == "USER" and s["seq"] == 3 for s in steps)
        assert stream.of("run")[-1]["messagesDelivered"] == 1
    # The tool's result came before the message, in one user turn.
    last_user = llm.seen[1].messages[-1]
    assert last_user["role"] == "user"
    assert [b["type"] for b in last_user["content"]] == ["tool_result", "text"]


async def test_created_by_names_the_identity(store: RunStore, toolbox: ToolBox) -> None:
    from agentrun.worker.api.app import create_app
    from agentrun.worker.obs.metrics import Metrics
    from agentrun.worker.settings import WorkerSettings
    from agentrun.worker.testing.scripted import ScriptedLlm
    from tests.support.builders import MODEL
    from tests.support.serving import asgi_client

    settings = WorkerSettings(database_url="unused", default_model=MODEL, api_token="s3cret")
    app = create_app(store, toolbox, settings, Metrics())
    auth = {"Authorization": "Bearer s3cret"}
    async with asgi_client(app) as http:
        r = await http.post("/api/runs", json={"input": "hi", "tokenBudget": 1000, "timeoutSeconds": 60},
                            headers=auth)
        run_id = r.json()["id"]
        r = await http.post(f"/api/runs/{run_id}/messages", json={"text": "from me"}, headers=auth)
        assert r.status_code == 202 and r.json()["createdBy"] == "default"
        assert (await http.post(f"/api/runs/{run_id}/messages", json={"text": "x"})).status_code == 401
        async with running(worker(store, ScriptedLlm().then_text("ok"), toolbox)):
            found: dict[str, Any] = {}

            async def done() -> bool:
                found.update((await http.get(f"/api/runs/{run_id}", headers=auth)).json())
                return found["status"] == "SUCCEEDED"

            from tests.support.waiting import eventually
            await eventually(done, 30, "the run to succeed")
        timeline = (await http.get(f"/api/runs/{run_id}/timeline", headers=auth)).json()
    assert [(s["kind"], s.get("createdBy")) for s in timeline] == [("USER", "default"), ("MODEL", None)]


async def test_the_cli_sends_a_message_and_watch_shows_it(
    store: RunStore, toolbox: ToolBox, server_url: str, capsys: Any, restore_logging: None
) -> None:
    from tests.support.cli import agentrun

    llm = Gate()
    async with httpx.AsyncClient(base_url=server_url, timeout=30) as http:
        run_id = await submit(http, tools=["lookup"])
    async with running(worker(store, llm, toolbox)):
        await asyncio.wait_for(llm.entered.wait(), 10)
        code, out, err = await agentrun(capsys, "runs", "message", run_id, "use the EU region", "--url", server_url)
        assert code == 0, err
        assert out.strip() == f"{run_id} message 1 accepted: the run gets it at its next turn boundary"
        llm.proceed.set()
        code, out, err = await agentrun(capsys, "runs", "watch", run_id, "--url", server_url, "--interval", "0.05")
    assert code == 0, err
    lines = out.splitlines()
    assert any(line.split()[:2] == ["3", "USER"] for line in lines), out
    assert "  user (seq 3): use the EU region" in lines
    code, _, err = await agentrun(capsys, "runs", "message", run_id, "too late", "--url", server_url)
    assert code == 1 and "HTTP 409" in err and "continueFrom" in err and "Traceback" not in err
    code, _, err = await agentrun(capsys, "runs", "message", run_id, "", "--url", server_url)
    assert code == 1 and "HTTP 422" in err and "text" in err
