"""`traceparent` on POST /api/runs: stored with the run; a malformed one is ignored (W3C) and said so."""

from __future__ import annotations

from typing import Any

import httpx
import psycopg

from agentrun.worker.obs.tracing.context import TRACEPARENT_PATTERN

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


async def test_a_malformed_traceparent_is_ignored_and_said_so(client: httpx.AsyncClient, db: psycopg.AsyncConnection[Any]) -> None:
    """W3C: a receiver ignores a traceparent it cannot parse. The run is made, in a trace of its own."""
    bad = ("nonsense", CALLER.upper(), "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
           "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
           "00-00000000000000000000000000000000-b7ad6b7169203331-01", "00-" + "a" * 2000)
    for value in bad:
        r = await client.post("/api/runs", json=RUN, headers={"traceparent": value})
        assert r.status_code == 201, (value, r.text)
        assert r.headers["traceparent-ignored"].startswith("traceparent "), value
        row = await (await db.execute("SELECT traceparent FROM run WHERE id = %s", (r.json()["id"],))).fetchone()
        assert row == (None,)
    good = await client.post("/api/runs", json=RUN, headers={"traceparent": CALLER})
    assert "traceparent-ignored" not in good.headers
    assert await (await db.execute("SELECT count(*) FROM run")).fetchone() == (len(bad) + 1,)


async def test_the_openapi_document_names_the_header(client: httpx.AsyncClient) -> None:
    doc = (await client.get("/openapi.json")).json()
    params = {p["name"]: p for p in doc["paths"]["/api/runs"]["post"]["parameters"]}
    assert params["traceparent"]["in"] == "header"
    assert params["traceparent"]["schema"]["type"] == "string"
    assert TRACEPARENT_PATTERN in params["traceparent"]["description"]
