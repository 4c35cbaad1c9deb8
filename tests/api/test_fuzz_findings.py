"""Regression tests for what fuzzing the API from its OpenAPI document found (tests/api/test_fuzz.py).

Each test pins one finding: a request the document allows that the server refused, a request the
server could not store (a 500), or a document that said something the server does not do.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

import httpx
import psycopg
import pytest
from fastapi import FastAPI

from agentrun.worker.obs.metrics import Metrics
from agentrun.worker.settings import WorkerSettings
from agentrun.worker.store import RunStore
from agentrun.worker.tools import ToolBox
from tests.support.api import make_app
from tests.support.serving import asgi_client

RUN = {"input": "Which acme tickets are overdue?", "tokenBudget": 50_000, "timeoutSeconds": 300}


async def _document(client: httpx.AsyncClient) -> dict[str, Any]:
    return (await client.get("/openapi.json")).json()  # type: ignore[no-any-return]


def _run_request(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["components"]["schemas"]["RunRequest"]["properties"]  # type: ignore[no-any-return]


def _string_branch(prop: dict[str, Any]) -> dict[str, Any]:
    return next(b for b in prop.get("anyOf", [prop]) if b.get("type") in ("string", "array"))


# -- a cost budget below what NUMERIC(14, 6) holds was a 500 ------------------------------------------


@pytest.mark.parametrize("tiny", [5e-324, 1e-7, 4.9e-7])
async def test_a_cost_budget_too_small_to_store_is_a_422_not_a_500(
    client: httpx.AsyncClient, db: psycopg.AsyncConnection[Any], tiny: float
) -> None:
    # It used to round to 0.000000 in the column, whose CHECK (> 0) refused it: an IntegrityError, a 500.
    r = await client.post("/api/runs", json={**RUN, "costBudgetUsd": tiny})
    assert r.status_code == 422, r.text
    assert r.json()["fields"][0]["field"] == "costBudgetUsd"
    assert await (await db.execute("SELECT count(*) FROM run")).fetchone() == (0,)
    prop = _run_request(await _document(client))["costBudgetUsd"]
    assert _string_branch({"anyOf": [dict(b, type="string") for b in prop["anyOf"] if "minimum" in b]})[
        "minimum"] == 0.000001


async def test_a_cost_budget_is_kept_to_the_micro_dollar_and_an_idempotent_retry_matches(
    client: httpx.AsyncClient,
) -> None:
    body, key = {**RUN, "costBudgetUsd": 1.0000004}, {"Idempotency-Key": "cost-1"}
    first = await client.post("/api/runs", json=body, headers=key)
    again = await client.post("/api/runs", json=body, headers=key)
    assert first.status_code == again.status_code == 201, again.text
    assert again.json()["id"] == first.json()["id"] and again.headers["Idempotent-Replayed"] == "true"
    assert (await client.get(f"/api/runs/{first.json()['id']}")).json()["costBudgetUsd"] == 1.0


# -- the document states the text rules the server applies ----------------------------------------------


@pytest.mark.parametrize("value", ["", " ", "\t\n", "\u2003", "a", " a ", "\u202eevil", "e\u0301", "🤖", "a\u0000b", "\u0000"])
@pytest.mark.parametrize("field", ["input", "model", "system", "tools"])
async def test_documented_text_patterns_agree_with_the_server(
    store: RunStore, metrics: Metrics, field: str, value: str
) -> None:
    # Tools are a closed list: a toolbox with exactly this name makes the name rules the only question.
    from agentrun.worker.tools import ToolContext, tool

    @tool(name=value or "unused", description="named for the test")
    def named(args: dict[str, Any], ctx: ToolContext) -> str:
        return "ok"

    app = make_app(store, ToolBox([named]), WorkerSettings(database_url="unused"), metrics)
    async with asgi_client(app) as client:
        prop = _string_branch(_run_request(await _document(client))[field])
        schema = prop["items"] if field == "tools" else prop
        documented = (len(value) >= schema.get("minLength", 0)
                      and re.search(schema["pattern"], value) is not None)
        r = await client.post("/api/runs", json={**RUN, field: [value] if field == "tools" else value})
        assert r.status_code == (201 if documented else 422), (field, value, schema, r.text)


# -- whole numbers written as 300.0 are integers, as JSON Schema says -----------------------------------


async def test_an_integral_float_is_an_integer_and_a_fraction_is_refused(client: httpx.AsyncClient) -> None:
    r = await client.post("/api/runs", json={**RUN, "tokenBudget": 1000.0, "timeoutSeconds": 60.0, "maxSteps": 5.0})
    assert r.status_code == 201, r.text
    run = (await client.get(f"/api/runs/{r.json()['id']}")).json()
    assert (run["tokenBudget"], run["timeoutSeconds"], run["maxSteps"]) == (1000, 60, 5)
    for bad in (1000.5, "1000", True, 1e300):
        r = await client.post("/api/runs", json={**RUN, "tokenBudget": bad})
        assert r.status_code == 422 and r.json()["fields"][0]["field"] == "tokenBudget", (bad, r.text)


# -- the document names the server's tools -----------------------------------------------------------------


async def test_the_document_lists_the_tools_this_server_accepts(client: httpx.AsyncClient, toolbox: ToolBox,
                                                                store: RunStore, metrics: Metrics) -> None:
    tools = _string_branch(_run_request(await _document(client))["tools"])
    assert tools["items"]["enum"] == toolbox.names == ["broken", "lookup", "noop"]
    async with asgi_client(make_app(store, ToolBox(), WorkerSettings(database_url="unused"), metrics)) as bare:
        assert _string_branch(_run_request(await _document(bare))["tools"])["maxItems"] == 0
        assert (await bare.post("/api/runs", json={**RUN, "tools": []})).status_code == 201


# -- Idempotency-Key: documented bounds, printable ASCII ----------------------------------------------------


@pytest.mark.parametrize(("key", "status"), [("k", 201), ("a key with spaces ~!", 201), ("k" * 255, 201),
                                             ("k" * 256, 422), ("ké", 422), ("\x7f", 422)])
async def test_idempotency_key_is_printable_ascii_as_documented(client: httpx.AsyncClient, key: str,
                                                                status: int) -> None:
    r = await client.post("/api/runs", json=RUN, headers={"Idempotency-Key": key.encode("latin-1")})  # type: ignore[dict-item]
    assert r.status_code == status, r.text
    if status == 422:
        assert r.json()["fields"] == [{"field": "Idempotency-Key",
                                       "problem": "must be 1 to 255 printable ASCII characters"}]
    param = next(p for p in (await _document(client))["paths"]["/api/runs"]["post"]["parameters"]
                 if p["name"] == "Idempotency-Key")
    assert (param["schema"]["minLength"], param["schema"]["maxLength"]) == (1, 255)
    assert bool(re.search(param["schema"]["pattern"], key)) == (status == 201 or len(key) > 255)


# -- the bearer scheme is documented exactly when the server has a token -------------------------------------


async def test_security_is_documented_only_when_a_token_is_required(
    client: httpx.AsyncClient, store: RunStore, toolbox: ToolBox, metrics: Metrics
) -> None:
    # An open server that advertised a required token would be lying (schemathesis: "accepts invalid auth").
    open_doc = await _document(client)
    assert "securitySchemes" not in open_doc.get("components", {})
    api_ops = [op for path, ops in open_doc["paths"].items() if path.startswith("/api") for op in ops.values()]
    assert api_ops and all("security" not in op and "401" not in op["responses"] for op in api_ops)

    guarded: FastAPI = make_app(store, toolbox, WorkerSettings(database_url="unused", api_token="t0ken-xyz"), metrics)
    async with asgi_client(guarded) as c:
        doc = await _document(c)
    assert doc["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    for path, ops in doc["paths"].items():
        for op in ops.values():
            assert ("security" in op and "401" in op["responses"]) == path.startswith("/api"), path


# -- 405 names every method of the path ----------------------------------------------------------------------


@pytest.mark.parametrize(("method", "path", "allowed"), [
    ("DELETE", "/api/runs", "GET, POST"),
    ("PUT", "/api/runs/{id}", "GET"),
    ("GET", "/api/runs/{id}/cancel", "POST"),
])
async def test_method_not_allowed_names_every_method_of_the_path(client: httpx.AsyncClient, method: str, path: str,
                                                                 allowed: str) -> None:
    # Starlette named only the first route's methods: `DELETE /api/runs` answered `Allow: POST`.
    r = await client.request(method, path.format(id=uuid.uuid4()))
    assert r.status_code == 405
    assert r.headers["allow"] == allowed
    assert r.json()["error"] == "Method Not Allowed"
