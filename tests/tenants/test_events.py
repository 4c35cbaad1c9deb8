"""An event is its tenant's: it wakes only its tenant's waits, a wait that begins later gets only its tenant's
events, and an event's Idempotency-Key is its tenant's."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from agentrun.worker.api.app import create_app
from agentrun.worker.core.records import RunStatus
from agentrun.worker.obs.metrics import Metrics
from agentrun.worker.settings import WorkerSettings
from agentrun.worker.store import RunStore
from agentrun.worker.testing.scripted import ScriptedLlm
from agentrun.worker.tools import ToolBox
from tests.support.builders import MODEL, new_run, worker
from tests.support.running import finished, running
from tests.support.serving import asgi_client
from tests.support.waiting import eventually


def waiter(llm: ScriptedLlm, tool_use_id: str, key: str) -> ScriptedLlm:
    return llm.then_tool_use(tool_use_id, "wait_for_event", {"key": key, "timeoutSeconds": 120})


async def test_an_event_wakes_only_its_tenants_waits(store: RunStore) -> None:
    a, _ = await store.create(new_run("a waits", tools=("wait_for_event",), tenant="team-a"))
    b, _ = await store.create(new_run("b waits", tools=("wait_for_event",), tenant="team-b"))
    llm = waiter(waiter(ScriptedLlm(), "toolu_0", "deploy"), "toolu_1", "deploy").then_text("woken").then_text("woken")
    async with running(worker(store, llm)):
        async def both_parked() -> bool:
            runs = [await store.get(a.id), await store.get(b.id)]
            return all(r is not None and r.status is RunStatus.WAITING for r in runs)

        await eventually(both_parked, 60, "both runs to wait for the event")
        assert (await store.post_event("deploy", 1, tenant="team-b")).woke == [b.id]
        assert (await finished(store, b.id)).status is RunStatus.SUCCEEDED
        still = await store.get(a.id)
        assert still is not None and still.status is RunStatus.WAITING
        assert (await store.post_event("deploy", 2, tenant="team-a")).woke == [a.id]
        assert (await finished(store, a.id)).status is RunStatus.SUCCEEDED


async def test_a_wait_that_begins_later_gets_only_its_tenants_kept_event(store: RunStore) -> None:
    await store.post_event("report", {"for": "b"}, tenant="team-b")
    await store.post_event("report", {"for": "a"}, tenant="team-a")
    a, _ = await store.create(new_run("a waits", tools=("wait_for_event",), tenant="team-a"))
    llm = waiter(ScriptedLlm(), "toolu_a", "report").then_text("got it")
    async with running(worker(store, llm)):
        assert (await finished(store, a.id)).status is RunStatus.SUCCEEDED
    [step] = [s for s in await store.steps(a.id) if s.tool_use_id == "toolu_a"]
    assert json.loads(step.response or "null") == {"for": "a"}


async def test_an_events_idempotency_key_is_its_tenants(store: RunStore) -> None:
    first = await store.post_event("k", 1, idempotency_key="same", tenant="team-a")
    again = await store.post_event("k", 1, idempotency_key="same", tenant="team-a")
    other = await store.post_event("k", 1, idempotency_key="same", tenant="team-b")
    assert not first.replayed and again.replayed and not other.replayed


async def test_the_api_posts_an_event_for_the_callers_tenant(
    store: RunStore, toolbox: ToolBox, metrics: Metrics, tmp_path: Path,
) -> None:
    def token(name: str) -> str:
        return f"agrt_{name}-events-token-0123456789"

    path = tmp_path / "tokens.json"
    path.write_text(json.dumps({"identities": [
        {"name": n, "sha256": hashlib.sha256(token(n).encode()).hexdigest(), "scopes": ["signal"], "tenant": t}
        for n, t in (("a-bot", "team-a"), ("ops", "*"))]}))
    settings = WorkerSettings(database_url="unused", default_model=MODEL, api_tokens_file=str(path))
    async with asgi_client(create_app(store, toolbox, settings, metrics)) as http:
        def auth(name: str) -> dict[str, str]:
            return {"Authorization": f"Bearer {token(name)}"}

        assert (await http.post("/api/events", json={"key": "x"}, headers=auth("a-bot"))).status_code == 200
        refused = await http.post("/api/events", json={"key": "x", "tenant": "team-b"}, headers=auth("a-bot"))
        assert refused.status_code == 403 and refused.json()["fields"][0]["field"] == "tenant"
        assert (await http.post("/api/events", json={"key": "x", "tenant": "team-b"}, headers=auth("ops"))
                ).status_code == 200
        assert (await http.post("/api/events", json={"key": "x"}, headers=auth("ops"))).status_code == 200
    async with store.pool.connection() as conn:
        rows = await (await conn.execute("SELECT tenant FROM run_event ORDER BY id")).fetchall()
    assert [r[0] for r in rows] == ["team-a", "team-b", "default"]
