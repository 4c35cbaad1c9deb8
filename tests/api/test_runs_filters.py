"""GET /api/runs filters over a real database: each alone, combined, with keyset paging past 100, and every
bad value a 422 naming its parameter; the list's new fields (labels, parentRunId, agent, startedAt, a null
cost for an unpriced model)."""

from __future__ import annotations

import datetime
from typing import Any

import httpx
import psycopg
import pytest

from agentrun.worker.store import RunStore
from agentrun.worker.testing.scripted import ScriptedLlm
from agentrun.worker.tools import ToolBox
from tests.support.builders import MODEL, worker

RUN = {"input": "Which acme tickets are overdue?", "tokenBudget": 50_000, "timeoutSeconds": 300}


async def submit(client: httpx.AsyncClient, **fields: Any) -> str:
    r = await client.post("/api/runs", json={**RUN, **fields})
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


async def listed(client: httpx.AsyncClient, **params: Any) -> list[str]:
    """Every id the list answers for `params`, all pages followed."""
    ids: list[str] = []
    after: str | None = None
    while True:
        r = await client.get("/api/runs", params={**params, **({"after": after} if after else {})})
        assert r.status_code == 200, r.text
        page = r.json()
        ids += [i["id"] for i in page["items"]]
        after = page["next"]
        if after is None:
            return ids


def problems(r: httpx.Response) -> dict[str, str]:
    return {p["field"]: p["problem"] for p in r.json()["fields"]}


async def test_label_selector_in_every_form(client: httpx.AsyncClient) -> None:
    a = await submit(client, labels={"team": "billing", "env": "prod", "tier": "a"})
    b = await submit(client, labels={"team": "billing", "env": "dev", "tier": "b", "app.kubernetes.io/name": "x"})
    c = await submit(client, labels={"team": "search", "tier": "c"})
    d = await submit(client)  # no labels
    cases = {
        "team=billing": [b, a],
        "team==billing": [b, a],
        "team=billing,env!=prod": [b],
        "env!=prod": [d, c, b],  # an absent key satisfies !=, as in Kubernetes
        "tier in (a,b)": [b, a],
        "tier in (a, c),team=search": [c],
        "tier notin (a,b)": [d, c],
        "env": [b, a],
        "!env": [d, c],
        "app.kubernetes.io/name=x": [b],
        "team=billing,team=search": [],  # both must hold
        "team=billing, env!=prod, tier in (a,b), tier notin (c), env, !nope": [b],
    }
    for selector, expected in cases.items():
        assert await listed(client, labelSelector=selector) == expected, selector
    run = (await client.get(f"/api/runs/{a}")).json()
    assert run["labels"] == {"team": "billing", "env": "prod", "tier": "a"}
    item = (await client.get("/api/runs", params={"labelSelector": "tier=c"})).json()["items"][0]
    assert item["labels"] == {"team": "search", "tier": "c"}


@pytest.mark.parametrize("selector", [
    "", "team in (a", "team in a", "team=", "=x", "team=billing,", "!", "team notin ()", "a b",
    "team=bad value!", "-bad=x", "team=" + "v" * 64, "Bad_Prefix/name=x", "in (a)",
])
async def test_a_bad_selector_is_a_422_naming_it(client: httpx.AsyncClient, selector: str) -> None:
    if selector == "team=":  # an empty value is a value: the label is there and empty
        assert (await client.get("/api/runs", params={"labelSelector": selector})).status_code == 200
        return
    r = await client.get("/api/runs", params={"labelSelector": selector})
    assert r.status_code == 422, (selector, r.text)
    assert "labelSelector" in problems(r) and "Traceback" not in r.text


async def test_status_model_agent_creator_parent_time_and_text(
    client: httpx.AsyncClient, store: RunStore, db: psycopg.AsyncConnection[Any], toolbox: ToolBox
) -> None:
    first = await submit(client, input="Pay the ACME invoice", model="claude-unpriced-9")
    await worker(store, ScriptedLlm().then_text("paid", 10, 5), toolbox).run_once()
    second = await submit(client, input="Summarise the quarter")
    await client.post(f"/api/runs/{second}/cancel")
    cont = await submit(client, continueFrom=first, input="and the next one")
    third = await submit(client, input="Another acme question")
    await db.execute("UPDATE run SET created_by = 'alice' WHERE id = %s", (third,))
    await db.execute("UPDATE run SET agent = 'researcher', agent_version = 2 WHERE id = %s", (second,))
    await db.execute("UPDATE run SET created_at = created_at - interval '2 days' WHERE id = %s", (first,))

    assert await listed(client, status="succeeded") == [first]
    assert await listed(client, status="Cancelled,QUEUED") == [third, cont, second]
    assert await listed(client, status=" queued , queued ") == [third, cont]
    assert await listed(client, model="claude-unpriced-9") == [cont, first]  # a continuation keeps its model
    assert await listed(client, model=MODEL) == [third, second]
    assert await listed(client, agent="researcher") == [second]
    assert await listed(client, agent="researcher@2") == [second]
    assert await listed(client, agent="researcher@3") == []
    assert await listed(client, createdBy="alice") == [third]
    assert await listed(client, parent=first) == [cont]
    assert await listed(client, q="acme") == [third, first]
    assert await listed(client, q="ACME", status="queued") == [third]
    assert await listed(client, q="100%_") == []  # no pattern characters: a plain substring
    yesterday = (datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=1)).isoformat()
    assert await listed(client, createdBefore=yesterday) == [first]
    assert await listed(client, createdAfter=yesterday) == [third, cont, second]
    assert await listed(client, createdAfter=yesterday.replace("+00:00", "Z"), q="acme") == [third]

    items = {i["id"]: i for i in (await client.get("/api/runs")).json()["items"]}
    assert items[cont]["parentRunId"] == first and items[first]["parentRunId"] is None
    assert items[second]["agent"] == "researcher@2" and items[first]["agent"] is None
    assert items[first]["startedAt"] and items[third]["startedAt"] is None and items[first]["finishedAt"]
    # The unpriced model's cost is unknown, not nought; a priced model's nought is a nought.
    assert items[first]["costUsd"] is None and items[first]["costUsdTotal"] is None
    assert items[third]["costUsd"] == 0.0
    run = (await client.get(f"/api/runs/{first}")).json()
    assert run["costUsd"] is None and run["costUsdTotal"] is None and run["startedAt"]
    assert (await client.get(f"/api/runs/{cont}")).json()["parentRunId"] == first


async def test_paging_past_a_hundred_with_a_filter(client: httpx.AsyncClient, db: psycopg.AsyncConnection[Any]) -> None:
    """230 labelled runs among others: every one, once each, newest first, in pages of 100 (and of 7)."""
    ids = [await submit(client, input=f"run {i}", labels={"batch": "big"}) for i in range(230)]
    for _ in range(5):
        await submit(client, labels={"batch": "other"})
    assert await listed(client, labelSelector="batch=big", limit=100) == ids[::-1]
    assert await listed(client, labelSelector="batch=big", status="queued", limit=7) == ids[::-1]


@pytest.mark.parametrize(("params", "field"), [
    ({"status": "DONE"}, "status"),
    ({"status": "running,"}, "status"),
    ({"createdAfter": "yesterday"}, "createdAfter"),
    ({"createdBefore": "2026-13-01T00:00:00Z"}, "createdBefore"),
    ({"createdAfter": "2026-12-01T10:00:00"}, "createdAfter"),  # no offset: no instant
    ({"parent": "nope"}, "parent"),
    ({"agent": "researcher@0"}, "agent"),
    ({"agent": "no such agent"}, "agent"),
    ({"q": "a\u0000b"}, "q"),
    ({"model": "m" * 1000}, "model"),
    ({"labelSelector": "x" * 5000}, "labelSelector"),
])
async def test_bad_filters_are_a_422_naming_the_parameter(
    client: httpx.AsyncClient, params: dict[str, Any], field: str
) -> None:
    r = await client.get("/api/runs", params=params)
    assert r.status_code == 422, r.text
    assert field in problems(r), r.text
