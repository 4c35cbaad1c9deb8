"""The REST API over a real database: every endpoint, its status codes, and every kind of bad input."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import httpx
import psycopg
import pytest
from fastapi import FastAPI

from agentrun.worker.core.records import RunStatus
from agentrun.worker.obs.metrics import Metrics
from agentrun.worker.settings import WorkerSettings
from agentrun.worker.store import RunStore
from agentrun.worker.testing.scripted import ScriptedLlm
from agentrun.worker.tools import ToolBox
from tests.support.api import make_app
from tests.support.builders import MODEL, new_run, worker
from tests.support.serving import asgi_client

RUN = {"input": "Which acme tickets are overdue?", "tokenBudget": 50_000, "timeoutSeconds": 300}


def problems(r: httpx.Response) -> dict[str, str]:
    body = r.json()
    assert isinstance(body["error"], str) and body["error"]
    return {p["field"]: p["problem"] for p in body["fields"]}


async def submit(client: httpx.AsyncClient, **fields: Any) -> dict[str, Any]:
    r = await client.post("/api/runs", json={**RUN, **fields})
    assert r.status_code == 201, r.text
    return r.json()  # type: ignore[no-any-return]


# -- submit and read -------------------------------------------------------------------------------


async def test_submit_queues_a_run_and_get_shows_it(client: httpx.AsyncClient) -> None:
    r = await client.post("/api/runs", json={**RUN, "tools": ["lookup"], "system": "Be brief.", "costBudgetUsd": 2.5,
                                             "maxSteps": 20})
    assert r.status_code == 201
    created = r.json()
    assert created["status"] == "QUEUED"
    assert r.headers["location"] == f"/api/runs/{created['id']}"

    run = (await client.get(f"/api/runs/{created['id']}")).json()
    assert run["id"] == created["id"]
    assert run["status"] == "QUEUED"
    assert run["input"] == RUN["input"]
    assert run["model"] == MODEL  # the settings' default
    assert run["tokenBudget"] == 50_000 and run["timeoutSeconds"] == 300 and run["maxSteps"] == 20
    assert run["tools"] == ["lookup"] and run["system"] == "Be brief." and run["costBudgetUsd"] == 2.5
    assert run["tokensUsed"] == 0 and run["costUsd"] == 0 and run["steps"] == 0
    assert run["error"] is None and run["lockedBy"] is None
    assert run["createdAt"] and run["startedAt"] is None and run["finishedAt"] is None


async def test_odd_unicode_and_long_input_round_trip(client: httpx.AsyncClient) -> None:
    text = "naïve café 🤖 עברית e\u0301 \u202e ｆｕｌｌ \U0001f9d1\u200d\U0001f4bb " * 2000  # ~100 KB
    created = await submit(client, input=text, model="claude-haiku-4-5")
    run = (await client.get(f"/api/runs/{created['id']}")).json()
    assert run["input"] == text and run["model"] == "claude-haiku-4-5"


async def test_idempotency_key_returns_the_same_run(client: httpx.AsyncClient, db: psycopg.AsyncConnection[Any]) -> None:
    headers = {"Idempotency-Key": "order-42"}
    first = await client.post("/api/runs", json=RUN, headers=headers)
    again = await client.post("/api/runs", json=RUN, headers=headers)
    assert first.status_code == again.status_code == 201
    assert again.json()["id"] == first.json()["id"]
    assert again.headers["idempotent-replayed"] == "true"
    other = await client.post("/api/runs", json=RUN, headers={"Idempotency-Key": "order-43"})
    assert other.json()["id"] != first.json()["id"]
    count = await (await db.execute("SELECT count(*) FROM run")).fetchone()
    assert count == (2,)


async def test_32_clients_resending_one_idempotency_key_at_once_make_exactly_one_run(
    server_url: str, db: psycopg.AsyncConnection[Any],
) -> None:
    """Over real HTTP connections, each its own, all at once: one run, and every answer names it."""
    headers = {"Idempotency-Key": "order-at-once"}

    async def send() -> httpx.Response:
        async with httpx.AsyncClient(base_url=server_url, timeout=60) as c:
            return await c.post("/api/runs", json=RUN, headers=headers)

    answers = await asyncio.gather(*(send() for _ in range(32)))
    assert {r.status_code for r in answers} == {201}, [r.text for r in answers if r.status_code != 201]
    assert len({r.json()["id"] for r in answers}) == 1
    assert sum(r.headers.get("idempotent-replayed") == "true" for r in answers) == 31
    count = await (await db.execute("SELECT count(*) FROM run WHERE idempotency_key = 'order-at-once'")).fetchone()
    assert count == (1,)


async def test_a_copy_sent_while_its_first_is_written_is_answered_as_a_retry(
    client: httpx.AsyncClient, db: psycopg.AsyncConnection[Any],
) -> None:
    """Copies of one key at once: answered with the first's run (the same request) or refused (another
    request), whichever of them is written first; one run either way."""
    headers = {"Idempotency-Key": "order-copies"}
    same = await asyncio.gather(*(client.post("/api/runs", json=RUN, headers=headers) for _ in range(3)))
    assert [r.status_code for r in same] == [201] * 3 and len({r.json()["id"] for r in same}) == 1
    assert sum(r.headers.get("idempotent-replayed") == "true" for r in same) == 2
    headers = {"Idempotency-Key": "order-copies-differ"}
    differ = await asyncio.gather(client.post("/api/runs", json=RUN, headers=headers),
                                  client.post("/api/runs", json={**RUN, "input": "something else"}, headers=headers))
    assert sorted(r.status_code for r in differ) == [201, 422]
    assert "Idempotency-Key" in problems(next(r for r in differ if r.status_code == 422))
    count = await (await db.execute("SELECT count(*) FROM run WHERE idempotency_key LIKE 'order-copies%'")).fetchone()
    assert count == (2,)


async def test_idempotency_key_reused_for_another_request_is_refused(client: httpx.AsyncClient) -> None:
    headers = {"Idempotency-Key": "order-42"}
    await client.post("/api/runs", json=RUN, headers=headers)
    r = await client.post("/api/runs", json={**RUN, "input": "something else"}, headers=headers)
    assert r.status_code == 422
    assert "Idempotency-Key" in problems(r)


# -- bad input -------------------------------------------------------------------------------------

DEEP = '{"input": "x", "tokenBudget": 1, "timeoutSeconds": 1, "tools": ' + "[" * 100_000 + "]" * 100_000 + "}"


async def test_a_cost_budget_on_a_model_without_a_price_is_refused(client: httpx.AsyncClient) -> None:
    """A step of an unpriced model costs null, so its budget could never stop the run: a 422, nothing stored."""
    r = await client.post("/api/runs", json={**RUN, "model": "claude-unpriced-9", "costBudgetUsd": 1})
    assert r.status_code == 422, r.text
    problem = problems(r)["costBudgetUsd"]
    assert "claude-unpriced-9" in problem and "no price" in problem and r.json()["error"] == problem
    assert (await client.get("/api/runs")).json()["items"] == []
    await submit(client, model="claude-unpriced-9")  # without a budget the model is fine
    await submit(client, costBudgetUsd=1)  # and a priced model (the default) takes a budget
    await submit(client, model=f"{MODEL}-20250929", costBudgetUsd=1)  # a dated snapshot costs its family's price


BAD_BODIES: list[tuple[str, Any, str]] = [
    ("missing input", {"tokenBudget": 10, "timeoutSeconds": 10}, "input"),
    ("empty input", {**RUN, "input": ""}, "input"),
    ("blank input", {**RUN, "input": " \n\t "}, "input"),
    ("zero budget", {**RUN, "tokenBudget": 0}, "tokenBudget"),
    ("negative budget", {**RUN, "tokenBudget": -5}, "tokenBudget"),
    ("missing budget", {"input": "x", "timeoutSeconds": 10}, "tokenBudget"),
    ("zero timeout", {**RUN, "timeoutSeconds": 0}, "timeoutSeconds"),
    ("timeout over 7 days", {**RUN, "timeoutSeconds": 7 * 24 * 3600 + 1}, "timeoutSeconds"),
    ("too many steps", {**RUN, "maxSteps": 10_001}, "maxSteps"),
    ("zero steps", {**RUN, "maxSteps": 0}, "maxSteps"),
    ("negative cost budget", {**RUN, "costBudgetUsd": -1}, "costBudgetUsd"),
    ("huge budget", {**RUN, "tokenBudget": 10**30}, "tokenBudget"),
    ("unknown tool", {**RUN, "tools": ["noop", "rm_rf"]}, "tools[1]"),
    ("budget as a string", {**RUN, "tokenBudget": "100"}, "tokenBudget"),
    ("budget as a float", {**RUN, "tokenBudget": 1.5}, "tokenBudget"),
    ("budget as a bool", {**RUN, "tokenBudget": True}, "tokenBudget"),
    ("input as a number", {**RUN, "input": 5}, "input"),
    ("input as an object", {**RUN, "input": {"a": 1}}, "input"),
    ("tools as a string", {**RUN, "tools": "noop"}, "tools"),
    ("tool as a number", {**RUN, "tools": [1]}, "tools[0]"),
    ("unknown field", {**RUN, "tokenbudget": 5}, "tokenbudget"),
    ("NUL in input", {**RUN, "input": "abc\u0000def"}, "input"),
    ("NUL in system", {**RUN, "system": "\u0000"}, "system"),
    ("NUL in model", {**RUN, "model": "claude\u0000"}, "model"),
    ("NUL in a tool name", {**RUN, "tools": ["no\u0000op"]}, "tools[0]"),
    ("very long model name", {**RUN, "model": "m" * 100_000}, "model"),
    ("too many tools", {**RUN, "tools": ["noop"] * 10_000}, "tools"),
    ("an array, not an object", [RUN], "body"),
    ("null", None, "body"),
]


@pytest.mark.parametrize(("why", "body", "field"), BAD_BODIES, ids=[b[0] for b in BAD_BODIES])
async def test_bad_run_is_refused_naming_the_field(client: httpx.AsyncClient, why: str, body: Any, field: str) -> None:
    r = await client.post("/api/runs", json=body)
    assert r.status_code in (400, 422), r.text
    assert field in problems(r), r.text
    assert "Traceback" not in r.text


RAW_BODIES: list[tuple[str, bytes]] = [
    ("not JSON", b"input=hello"),
    ("truncated JSON", b'{"input": "x", "tokenBudget": '),
    ("deep nesting", DEEP.encode()),
    ("lone surrogate", b'{"input": "\\ud800", "tokenBudget": 1, "timeoutSeconds": 1}'),
    ("invalid UTF-8", b'{"input": "\xff\xfe", "tokenBudget": 1, "timeoutSeconds": 1}'),
    ("NaN", b'{"input": "x", "tokenBudget": 1, "timeoutSeconds": 1, "costBudgetUsd": NaN}'),
    ("empty", b""),
]


@pytest.mark.parametrize(("why", "raw"), RAW_BODIES, ids=[b[0] for b in RAW_BODIES])
async def test_malformed_body_is_a_4xx(client: httpx.AsyncClient, db: psycopg.AsyncConnection[Any], why: str,
                                       raw: bytes) -> None:
    r = await client.post("/api/runs", content=raw, headers={"Content-Type": "application/json"})
    assert r.status_code in (400, 422), r.text
    assert "body" in problems(r)
    assert await (await db.execute("SELECT count(*) FROM run")).fetchone() == (0,)


async def test_body_over_the_limit_is_400_and_never_buffered_whole(
    store: RunStore, toolbox: ToolBox, metrics: Metrics
) -> None:
    app = make_app(store, toolbox, WorkerSettings(database_url="unused", max_body_bytes=2000), metrics)
    async with asgi_client(app) as client:
        r = await client.post("/api/runs", json={**RUN, "input": "x" * 3000})
        assert r.status_code == 400
        assert "2000 bytes" in r.json()["error"] and r.json()["fields"][0]["field"] == "body"

        async def chunks() -> Any:  # no Content-Length: the limit counts what arrives
            for _ in range(100):
                yield b"x" * 100

        r = await client.post("/api/runs", content=chunks(), headers={"Content-Type": "application/json"})
        assert r.status_code == 400
        assert (await client.post("/api/runs", json={**RUN, "input": "x" * 1000})).status_code == 201


async def test_default_body_limit_is_one_mebibyte(client: httpx.AsyncClient) -> None:
    r = await client.post("/api/runs", json={**RUN, "input": "x" * (1024 * 1024)})
    assert r.status_code == 400
    assert (await client.post("/api/runs", json={**RUN, "input": "x" * 1_000_000})).status_code == 201


async def test_bad_idempotency_key_is_refused(client: httpx.AsyncClient) -> None:
    r = await client.post("/api/runs", json=RUN, headers={"Idempotency-Key": "k" * 300})
    assert r.status_code == 422
    assert "Idempotency-Key" in problems(r)


@pytest.mark.parametrize("path", ["/api/runs/{}", "/api/runs/{}/timeline", "/api/runs/{}/steps/1"])
async def test_malformed_and_unknown_ids(client: httpx.AsyncClient, path: str) -> None:
    for bad in ("not-a-uuid", "6f1c0a52", "%00", "1" * 5000):
        r = await client.get(path.format(bad))
        assert r.status_code in (400, 404, 422), (bad, r.text)
        if r.status_code == 422:
            assert "id" in problems(r)
    r = await client.get(path.format(uuid.uuid4()))
    assert r.status_code == 404
    assert "no run" in r.json()["error"]


async def test_cancel_unknown_and_malformed(client: httpx.AsyncClient) -> None:
    assert (await client.post(f"/api/runs/{uuid.uuid4()}/cancel")).status_code == 404
    r = await client.post("/api/runs/nope/cancel")
    assert r.status_code == 422 and "id" in problems(r)


# -- timeline, steps, cancel --------------------------------------------------------------------------


async def test_timeline_and_step_of_a_finished_run(client: httpx.AsyncClient, store: RunStore, toolbox: ToolBox) -> None:
    from agentrun.worker.testing.scripted import ScriptedLlm
    from tests.support.builders import worker

    created = await submit(client, tools=["lookup"])
    llm = ScriptedLlm().then_tool_use("toolu_01Ab", "lookup", {"q": "acme"}, in_=812, out=64).then_text("3 tickets", 1210, 140)
    await worker(store, llm, toolbox).run_once()

    r = await client.get(f"/api/runs/{created['id']}/timeline")
    assert r.status_code == 200
    steps = r.json()
    assert [(s["seq"], s["kind"], s["status"]) for s in steps] == [(1, "MODEL", "DONE"), (2, "TOOL", "DONE"), (3, "MODEL", "DONE")]
    first, tool = steps[0], steps[1]
    assert first["stopReason"] == "tool_use" and first["inputTokens"] == 812 and first["outputTokens"] == 64
    assert first["cacheCreationInputTokens"] == 0 and first["cacheReadInputTokens"] == 0
    assert first["latencyMs"] is not None and first["startedAt"] and first["worker"] == "worker-A"
    assert tool["toolName"] == "lookup" and tool["toolUseId"] == "toolu_01Ab"
    assert all("request" not in s and "response" not in s for s in steps)

    detail = (await client.get(f"/api/runs/{created['id']}/steps/2")).json()
    assert detail["response"] == "found acme" and '"acme"' in detail["request"]
    assert (await client.get(f"/api/runs/{created['id']}/steps/4")).status_code == 404
    for seq in ("0", "-1", "abc", str(2**31), "1" * 400):
        r = await client.get(f"/api/runs/{created['id']}/steps/{seq}")
        assert r.status_code == 422 and "seq" in problems(r), seq

    run = (await client.get(f"/api/runs/{created['id']}")).json()
    assert run["status"] == "SUCCEEDED" and run["tokensUsed"] == 812 + 64 + 1210 + 140 and run["steps"] == 3
    assert run["lockedBy"] == "worker-A"
    r = await client.post(f"/api/runs/{created['id']}/cancel")
    assert r.status_code == 409 and "SUCCEEDED" in r.json()["error"]


async def test_cancel_a_queued_run_at_once_and_a_running_one_at_its_next_step(
    client: httpx.AsyncClient, store: RunStore
) -> None:
    queued = await submit(client)
    r = await client.post(f"/api/runs/{queued['id']}/cancel")
    assert r.status_code == 202
    assert r.json()["status"] == "CANCELLED" and r.json()["finishedAt"]
    assert (await client.post(f"/api/runs/{queued['id']}/cancel")).status_code == 409

    running = await submit(client)
    claimed = await store.claim("worker-A", 30)
    assert claimed is not None and str(claimed.run.id) == running["id"]
    r = await client.post(f"/api/runs/{running['id']}/cancel")
    assert r.status_code == 202
    assert r.json()["status"] == "RUNNING" and r.json()["cancelRequested"] is True


# -- listing -----------------------------------------------------------------------------------------


async def test_list_newest_first_with_keyset_pagination(client: httpx.AsyncClient) -> None:
    ids = [(await submit(client, input=f"run {i}"))["id"] for i in range(5)]
    await client.post(f"/api/runs/{ids[1]}/cancel")
    seen: list[str] = []
    after: str | None = None
    pages = 0
    while True:
        params = {"limit": 2, **({"after": after} if after else {})}
        r = await client.get("/api/runs", params=params)
        assert r.status_code == 200
        page = r.json()
        seen += [item["id"] for item in page["items"]]
        pages += 1
        after = page["next"]
        if after is None:
            break
    assert seen == ids[::-1] and pages == 3

    cancelled = (await client.get("/api/runs", params={"status": "CANCELLED"})).json()
    assert [i["id"] for i in cancelled["items"]] == [ids[1]] and cancelled["next"] is None
    item = cancelled["items"][0]
    assert item["inputPreview"] == "run 1" and item["status"] == "CANCELLED"
    empty = (await client.get("/api/runs", params={"status": "RUNNING"})).json()
    assert empty == {"items": [], "next": None}


@pytest.mark.parametrize(("params", "field"), [
    ({"status": "DONE"}, "status"),
    ({"status": "queued,nope"}, "status"),
    ({"labelSelector": "team in (a"}, "labelSelector"),
    ({"createdAfter": "yesterday"}, "createdAfter"),
    ({"agent": "bad name@0"}, "agent"),
    ({"limit": 0}, "limit"),
    ({"limit": -1}, "limit"),
    ({"limit": 100_000}, "limit"),
    ({"limit": "ten"}, "limit"),
    ({"after": "nope"}, "after"),
    ({"after": str(uuid.UUID(int=7))}, "after"),
])
async def test_list_refuses_bad_parameters(client: httpx.AsyncClient, params: dict[str, Any], field: str) -> None:
    r = await client.get("/api/runs", params=params)
    assert r.status_code in (400, 422), r.text
    assert field in problems(r)


# -- auth, health, faults -----------------------------------------------------------------------------


async def test_bearer_token_guards_the_api_but_not_health_or_metrics(
    store: RunStore, toolbox: ToolBox, metrics: Metrics, caplog: pytest.LogCaptureFixture
) -> None:
    token = "s3cret-token-value"
    app = make_app(store, toolbox, WorkerSettings(database_url="unused", api_token=token), metrics)
    async with asgi_client(app) as client:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": token},
                        {"Authorization": f"Basic {token}"}, {"Authorization": f"Bearer {token}x"}):
            for method, path in (("GET", "/api/runs"), ("POST", "/api/runs"), ("GET", f"/api/runs/{uuid.uuid4()}")):
                r = await client.request(method, path, headers=headers, json=RUN)
                assert r.status_code == 401, (headers, path)
                assert r.headers["www-authenticate"] == "Bearer"
        # Unauthenticated garbage learns nothing about validation either.
        assert (await client.post("/api/runs", content=b"{{{")).status_code == 401
        auth = {"Authorization": f"Bearer {token}"}
        assert (await client.post("/api/runs", json=RUN, headers=auth)).status_code == 201
        assert (await client.get("/api/runs", headers=auth)).status_code == 200
        for path in ("/healthz", "/readyz", "/metrics", "/openapi.json"):
            assert (await client.get(path)).status_code == 200, path
    assert token not in caplog.text


async def test_openapi_documents_the_api(client: httpx.AsyncClient) -> None:
    doc = (await client.get("/openapi.json")).json()
    assert {"/api/runs", "/api/runs/{id}", "/api/runs/{id}/timeline", "/api/runs/{id}/steps/{seq}",
            "/api/runs/{id}/cancel", "/api/runs/{id}/pending", "/api/runs/{id}/pending/{toolUseId}", "/healthz",
            "/readyz", "/metrics"} <= set(doc["paths"])
    props = doc["components"]["schemas"]["RunRequest"]["properties"]
    assert {"input", "model", "tokenBudget", "timeoutSeconds", "maxSteps", "tools", "system", "costBudgetUsd",
            "requireApproval", "continueFrom", "forkFrom", "outputSchema", "priority", "runAt", "delaySeconds",
            "agent", "subAgents", "webhook", "contextManagement", "labels", "tenant"} == set(props)
    assert "/api/workers" in doc["paths"]
    assert "next" in doc["paths"]["/api/runs"]["get"]["description"]


async def test_health_and_readiness(client: httpx.AsyncClient) -> None:
    assert (await client.get("/healthz")).json() == {"status": "ok"}
    ready = (await client.get("/readyz")).json()
    assert ready["status"] == "ok"


async def test_database_unavailable_is_503(store: RunStore, toolbox: ToolBox, settings: WorkerSettings,
                                          metrics: Metrics) -> None:
    app = make_app(store, toolbox, settings, metrics)
    await store.pool.close()
    async with asgi_client(app) as client:
        r = await client.get(f"/api/runs/{uuid.uuid4()}")
        assert r.status_code == 503 and r.json()["error"].startswith("database unavailable")
        assert (await client.get("/readyz")).status_code == 503
        assert (await client.get("/healthz")).status_code == 200
        assert (await client.get("/metrics")).status_code == 200


class _BrokenStore(RunStore):
    async def list_runs(self, status: RunStatus | None = None, limit: int = 50, after: uuid.UUID | None = None) -> Any:
        raise RuntimeError("a bug, with a secret in its message: hunter2")


async def test_a_server_fault_is_a_json_500_without_traceback(
    store: RunStore, toolbox: ToolBox, settings: WorkerSettings, metrics: Metrics
) -> None:
    app: FastAPI = make_app(_BrokenStore(store.pool), toolbox, settings, metrics)
    async with asgi_client(app) as client:
        r = await client.get("/api/runs")
    assert r.status_code == 500
    assert r.json() == {"error": "internal server error", "fields": []}


async def test_through_a_real_uvicorn_socket(server_url: str) -> None:
    async with httpx.AsyncClient(base_url=server_url) as client:
        created = (await client.post("/api/runs", json=RUN)).json()
        assert (await client.get(f"/api/runs/{created['id']}")).json()["status"] == "QUEUED"
        r = await client.post("/api/runs", content=DEEP.encode(), headers={"Content-Type": "application/json"})
        assert r.status_code == 400
        r = await client.post("/api/runs", json={**RUN, "input": "x" * (2 * 1024 * 1024)})
        assert r.status_code == 400
        assert (await client.get("/api/runs/zzz")).status_code == 422


async def test_run_names_its_kubernetes_link_in_camel_case(client: httpx.AsyncClient, store: RunStore) -> None:
    run, _ = await store.create(new_run(k8s_namespace="team-a", k8s_name="triage"))
    body = (await client.get(f"/api/runs/{run.id}")).json()
    assert body["k8sNamespace"] == "team-a" and body["k8sName"] == "triage"


async def test_a_model_step_started_when_its_call_did(store: RunStore, db: psycopg.AsyncConnection[Any]) -> None:
    # Times are read from the database's clock, the one started_at and finished_at come from. The call
    # takes CALL_SECONDS: long enough that a step stamped at its end (or timed from its end) cannot pass
    # for one stamped at its start, however slowly the step is written after the call.
    call_seconds = 1.0
    ended: list[Any] = []

    async def db_now() -> Any:
        row = await (await db.execute("SELECT clock_timestamp()")).fetchone()
        assert row is not None
        return row[0]

    call_took: list[float] = []

    class Slow(ScriptedLlm):
        async def send(self, request: Any) -> Any:
            t0 = time.monotonic()
            await asyncio.sleep(call_seconds)
            ended.append(await db_now())
            call_took.append(time.monotonic() - t0)
            return await super().send(request)

    run, _ = await store.create(new_run())
    before = await db_now()
    pass_started = time.monotonic()
    await worker(store, Slow().then_text("done"), []).run_once()
    pass_took = time.monotonic() - pass_started
    step = (await store.timeline(run.id))[0]
    assert step.started_at is not None and step.finished_at is not None and step.latency_ms is not None
    (call_ended,) = ended
    assert step.latency_ms >= call_seconds * 1000, "the step's latency is not the model call's"
    assert before <= step.started_at < call_ended, (before, step.started_at, call_ended)
    assert call_ended <= step.finished_at
    # started_at is finished_at minus latency_ms by construction; what is not is the latency itself: the
    # whole call (timed inside it), and no more than the worker's whole pass (not since the run was made).
    assert call_took[0] * 1000 - 1 <= step.latency_ms <= pass_took * 1000 + 1, (call_took, step.latency_ms, pass_took)
