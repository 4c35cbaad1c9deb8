"""POST /api/events over the real app and database: it wakes the runs waiting on its key (each getting its
payload), lists waits in GET /api/runs/{id}/pending, answers a retry with the first answer, and refuses a bad
body naming the field."""

from __future__ import annotations

import asyncio
import datetime
import uuid
from typing import Any

import httpx
import pytest

from agentrun.worker.store import RunStore
from agentrun.worker.testing.scripted import ScriptedLlm
from agentrun.worker.tools import ToolBox
from tests.support.api import status_is, submit
from tests.support.builders import worker
from tests.support.running import running


def _time(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text)


async def test_an_event_wakes_its_waiter_and_the_pending_view_shows_each_kind_of_wait(
    client: httpx.AsyncClient, store: RunStore, toolbox: ToolBox
) -> None:
    run_id = await submit(client, tools=["wait_for_event", "wait"])
    llm = ScriptedLlm().then_tool_use("toolu_e", "wait_for_event", {"key": "order:7", "timeoutSeconds": 600})
    llm.then_tool_use("toolu_t", "wait", {"seconds": 3600})
    async with running(worker(store, llm, toolbox)):
        run = await status_is(client, run_id, "WAITING")
        assert run["waitingFor"] == "event"
        [pending] = (await client.get(f"/api/runs/{run_id}/pending")).json()
        assert (pending["kind"], pending["key"], pending["toolUseId"], pending["tool"]) == (
            "event", "order:7", "toolu_e", "wait_for_event")
        assert _time(pending["timeoutAt"]) > datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=500)
        assert pending["input"] == {"key": "order:7", "timeoutSeconds": 600}
        r = await client.post("/api/events", json={"key": "order:7", "payload": {"paid": 12.5}})
        assert r.status_code == 200 and r.json() == {"woke": [run_id]} and "Idempotent-Replayed" not in r.headers

        async def timer_pending() -> dict[str, Any] | None:
            found = (await client.get(f"/api/runs/{run_id}/pending")).json()
            return found[0] if found and found[0]["kind"] == "timer" else None

        for _ in range(300):
            if (timer := await timer_pending()) is not None:
                break
            await asyncio.sleep(0.1)
        else:
            pytest.fail("the run never parked for its timer")
        assert timer["toolUseId"] == "toolu_t" and "key" in timer and timer["key"] is None
        assert _time(timer["wakeAt"]) > datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=3000)
        assert (await client.get(f"/api/runs/{run_id}")).json()["waitingFor"] == "timer"
        # Nobody waits on the key now: kept, and no one woken.
        assert (await client.post("/api/events", json={"key": "order:7"})).json() == {"woke": []}
        assert (await client.post(f"/api/runs/{run_id}/cancel")).status_code == 202
    steps = [s for s in await store.steps(uuid.UUID(run_id)) if s.tool_use_id == "toolu_e"]
    assert [s.response for s in steps] == ['{"paid":12.5}']


async def test_a_retried_post_with_its_idempotency_key_wakes_nobody_twice(
    client: httpx.AsyncClient, store: RunStore, toolbox: ToolBox
) -> None:
    run_id = await submit(client, tools=["wait_for_event"])
    llm = ScriptedLlm().then_tool_use("toolu_1", "wait_for_event", {"key": "ci:9", "timeoutSeconds": 600})
    llm.then_tool_use("toolu_2", "wait_for_event", {"key": "ci:9", "timeoutSeconds": 600})
    async with running(worker(store, llm, toolbox)):
        await status_is(client, run_id, "WAITING")
        headers = {"Idempotency-Key": "build-9-passed"}
        body = {"key": "ci:9", "payload": "green"}
        answers = await asyncio.gather(*(client.post("/api/events", json=body, headers=headers) for _ in range(3)))
        assert all(r.status_code == 200 and r.json() == {"woke": [run_id]} for r in answers)
        assert sorted(r.headers.get("Idempotent-Replayed", "") for r in answers) == ["", "true", "true"]

        async def second_wait() -> bool:
            found = (await client.get(f"/api/runs/{run_id}/pending")).json()
            return bool(found) and found[0]["toolUseId"] == "toolu_2"

        for _ in range(300):
            if await second_wait():
                break
            await asyncio.sleep(0.1)
        else:
            pytest.fail("the run never waited a second time")
        again = await client.post("/api/events", json=body, headers=headers)  # a late retry: nothing new
        assert again.json() == {"woke": [run_id]} and again.headers["Idempotent-Replayed"] == "true"
        run = (await client.get(f"/api/runs/{run_id}")).json()
        assert run["status"] == "WAITING" and run["waitingFor"] == "event"  # the second wait got nothing
        assert (await client.post(f"/api/runs/{run_id}/cancel")).status_code == 202


@pytest.mark.parametrize("body, field", [
    ({}, "key"), ({"key": ""}, "key"), ({"key": "  "}, "key"), ({"key": 5}, "key"), ({"key": "a\u0000"}, "key"),
    ({"key": "k" * 257}, "key"), ({"key": "k", "payload": {"t": "a\u0000b"}}, "payload"),
    ({"key": "k", "payload": "x" * 70_000}, "payload"), ({"key": "k", "extra": 1}, "extra"),
])
async def test_a_bad_event_is_refused_naming_the_field(client: httpx.AsyncClient, body: Any, field: str) -> None:
    r = await client.post("/api/events", json=body)
    assert r.status_code == 422, r.text
    assert field in [p["field"] for p in r.json()["fields"]], r.json()
    assert "Traceback" not in r.text


async def test_a_bad_body_or_idempotency_key_is_refused(client: httpx.AsyncClient) -> None:
    r = await client.post("/api/events", content=b"{nope", headers={"Content-Type": "application/json"})
    assert r.status_code == 400
    r = await client.post("/api/events", json={"key": "k"}, headers={"Idempotency-Key": "x" * 300})
    assert r.status_code == 422 and r.json()["fields"][0]["field"] == "Idempotency-Key"
