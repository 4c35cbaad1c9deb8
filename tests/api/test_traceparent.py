"""`traceparent` on POST /api/runs: stored with the run, refused with a 422 when malformed."""

from __future__ import annotations

from typing import Any

import httpx
import psycopg

from agentrun.worker.tracing.context import TRACEPARENT_PATTERN

RUN = {"input": "trace me", "tokenBudget": 50_000, "timeoutSeconds": 300}
CALLER = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


async def test_traceparent_is_stored_with_the_run(client: httpx.AsyncClient, db: psycopg.AsyncConnection[Any]) -> None:
    r = await client.post("/api/runs", json=RUN, headers={"traceparent": CALLER})
    assert r.status_code == 201, r.text
    row = await (await db.execute("SELECT traceparent FROM run WHERE id = %s", (r.json()["id"],))).fetchone()
    assert row == (CALLER,)
    plain = await client.post("/api/runs", json=RUN)
    row = await (await db.execute("SELECT traceparent FROM run WHERE id = %s", (plain.json()["id"],))).fetchone()
    assert row == (None,)


async def test_an_idempotent_retry_with_another_traceparent_is_the_same_request(client: httpx.AsyncClient) -> None:
    first = await client.post("/api/runs", json=RUN, headers={"Idempotency-Key": "k1", "traceparent": CALLER})
    again = await client.post("/api/runs", json=RUN, headers={
        "Idempotency-Key": "k1", "traceparent": "00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01"})
    assert first.status_code == again.status_code == 201 and first.json()["id"] == again.json()["id"]


async def test_malformed_traceparent_is_a_422_naming_it(client: httpx.AsyncClient, db: psycopg.AsyncConnection[Any]) -> None:
    for bad in ("nonsense", CALLER.upper(), "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
                "00-00000000000000000000000000000000-b7ad6b7169203331-01", "00-" + "a" * 2000):
        r = await client.post("/api/runs", json=RUN, headers={"traceparent": bad})
        assert r.status_code == 422, (bad, r.text)
        body = r.json()
        assert body["error"].startswith("traceparent ")
        assert [p["field"] for p in body["fields"]] == ["traceparent"]
    assert await (await db.execute("SELECT count(*) FROM run")).fetchone() == (0,)


async def test_the_openapi_document_names_the_header(client: httpx.AsyncClient) -> None:
    doc = (await client.get("/openapi.json")).json()
    params = {p["name"]: p for p in doc["paths"]["/api/runs"]["post"]["parameters"]}
    assert params["traceparent"]["in"] == "header"
    assert params["traceparent"]["schema"]["pattern"] == TRACEPARENT_PATTERN
