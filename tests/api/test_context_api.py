"""The `contextManagement` of a run request through the REST API: checked at submission (422 naming the
field, as every other field), shown in the run's JSON (the default spelt out), inherited by continuations
and forks, given by an agent; and COMPACT steps as the timeline and the step detail show them."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import psycopg
import pytest

BODY = {"input": "read the logs", "tokenBudget": 1000, "timeoutSeconds": 60}
DEFAULT = {"strategy": "auto", "keepRecentTurns": 2}


def problems(r: httpx.Response) -> dict[str, str]:
    return {p["field"]: p["problem"] for p in r.json()["fields"]}


@pytest.mark.parametrize(("value", "words"), [
    ({"strategy": "shrink"}, "contextManagement.strategy must be one of"),
    ({"strategy": "summarize", "keepRecentTurns": -1}, "contextManagement.keepRecentTurns"),
    ({"strategy": "summarize", "keepRecentTurns": 2.5}, "contextManagement.keepRecentTurns"),
    ({"triggerTokens": 0}, "contextManagement.triggerTokens"),
    ({"triggerTokens": "many"}, "contextManagement.triggerTokens"),
    ({"strategy": "none", "extra": 1}, "unknown field(s) extra"),
    ("summarize", "contextManagement must be an object"),
    ([], "contextManagement must be an object"),
])
async def test_a_bad_policy_is_refused_naming_the_field(
    client: httpx.AsyncClient, db: psycopg.AsyncConnection[Any], value: Any, words: str
) -> None:
    r = await client.post("/api/runs", json={**BODY, "contextManagement": value})
    assert r.status_code == 422, r.text
    assert "contextManagement" in problems(r) and words in r.text, r.text
    assert "Traceback" not in r.text
    assert await (await db.execute("SELECT count(*) FROM run")).fetchone() == (0,)


async def test_the_run_stores_and_shows_its_policy(client: httpx.AsyncClient, db: psycopg.AsyncConnection[Any]) -> None:
    r = await client.post("/api/runs", json={**BODY, "contextManagement": {"strategy": "summarize",
                                                                           "triggerTokens": 50_000.0}})
    assert r.status_code == 201, r.text
    run_id = r.json()["id"]
    shown = {"strategy": "summarize", "keepRecentTurns": 2, "triggerTokens": 50_000}
    assert (await client.get(f"/api/runs/{run_id}")).json()["contextManagement"] == shown
    row = await (await db.execute("SELECT context_management FROM run WHERE id = %s", (run_id,))).fetchone()
    assert row == (shown,)
    plain = (await client.post("/api/runs", json=BODY)).json()["id"]
    assert (await client.get(f"/api/runs/{plain}")).json()["contextManagement"] == DEFAULT
    row = await (await db.execute("SELECT context_management FROM run WHERE id = %s", (plain,))).fetchone()
    assert row == (None,)


async def test_the_engine_reads_the_policy_on_the_run_record(client: httpx.AsyncClient, store: Any) -> None:
    r = await client.post("/api/runs", json={**BODY, "contextManagement": {"strategy": "clear_tool_results"}})
    run = await store.get(r.json()["id"])
    assert run.context_management == {"strategy": "clear_tool_results", "keepRecentTurns": 2}


async def test_continuations_and_forks_inherit_the_policy_unless_they_name_one(
    client: httpx.AsyncClient, db: psycopg.AsyncConnection[Any]
) -> None:
    policy = {"strategy": "summarize", "keepRecentTurns": 3}
    source = (await client.post("/api/runs", json={**BODY, "contextManagement": policy})).json()["id"]
    await db.execute("UPDATE run SET status = 'SUCCEEDED', finished_at = now(), output = to_jsonb('ok'::text) "
                     "WHERE id = %s", (source,))
    await db.execute("INSERT INTO run_step (run_id, seq, kind, status, response, started_at, finished_at) "
                     "VALUES (%s, 1, 'USER', 'DONE', '\"read\"', now(), now())", (source,))
    cont = (await client.post("/api/runs", json={"continueFrom": source, "input": "and then?"})).json()["id"]
    fork = (await client.post("/api/runs", json={"forkFrom": {"runId": source, "seq": 1}})).json()["id"]
    own = (await client.post("/api/runs", json={"continueFrom": source, "input": "x",
                                                "contextManagement": {"strategy": "none"}})).json()["id"]
    assert (await client.get(f"/api/runs/{cont}")).json()["contextManagement"] == policy
    assert (await client.get(f"/api/runs/{fork}")).json()["contextManagement"] == policy
    assert (await client.get(f"/api/runs/{own}")).json()["contextManagement"] == {"strategy": "none",
                                                                                  "keepRecentTurns": 2}


async def test_a_retry_with_another_policy_is_not_the_same_request(client: httpx.AsyncClient) -> None:
    headers = {"Idempotency-Key": "ctx-1"}
    first = await client.post("/api/runs", json={**BODY, "contextManagement": {"strategy": "none"}}, headers=headers)
    again = await client.post("/api/runs", json={**BODY, "contextManagement": {"strategy": "none"}}, headers=headers)
    other = await client.post("/api/runs", json={**BODY, "contextManagement": {"strategy": "server"}},
                              headers=headers)
    assert (first.status_code, again.status_code, again.headers.get("Idempotent-Replayed")) == (201, 201, "true")
    assert other.status_code == 422, other.text


async def test_an_agents_policy_is_its_runs_unless_they_name_their_own(client: httpx.AsyncClient) -> None:
    bad = await client.post("/api/agents", json={"name": "reader", "contextManagement": {"strategy": "fold"}})
    assert bad.status_code == 422 and "contextManagement" in problems(bad), bad.text
    policy = {"strategy": "clear_tool_results", "keepRecentTurns": 1}
    r = await client.post("/api/agents", json={"name": "reader", "contextManagement": policy, "tokenBudget": 1000,
                                               "timeoutSeconds": 60})
    assert r.status_code == 201, r.text
    assert (await client.get("/api/agents/reader")).json()["contextManagement"] == policy
    same = (await client.post("/api/runs", json={"agent": "reader", "input": "x"})).json()["id"]
    own = (await client.post("/api/runs", json={"agent": "reader", "input": "x",
                                                "contextManagement": {"strategy": "server"}})).json()["id"]
    assert (await client.get(f"/api/runs/{same}")).json()["contextManagement"] == policy
    assert (await client.get(f"/api/runs/{own}")).json()["contextManagement"]["strategy"] == "server"


async def test_the_document_states_the_policy_schema(client: httpx.AsyncClient) -> None:
    doc = (await client.get("/openapi.json")).json()
    field = doc["components"]["schemas"]["RunRequest"]["properties"]["contextManagement"]
    [schema] = [s for s in field["anyOf"] if s.get("type") == "object"]
    assert schema["additionalProperties"] is False
    assert schema["properties"]["strategy"]["enum"] == ["auto", "server", "summarize", "clear_tool_results", "none"]


async def test_compact_steps_show_what_they_did(client: httpx.AsyncClient, db: psycopg.AsyncConnection[Any]) -> None:
    run_id = (await client.post("/api/runs", json=BODY)).json()["id"]
    summarised = {"strategy": "summarize", "keepFromSeq": 7, "coversSeqs": [1, 6], "estimatedTokens": 170_000,
                  "window": 200_000, "triggerTokens": 160_000}
    cleared = {**summarised, "strategy": "clear_tool_results", "keepFromSeq": 11, "coversSeqs": [2, 9]}
    context = {"strategy": "summarize", "estimatedTokens": 40_000, "window": 200_000, "contextTokens": 39_500,
               "compacted": False, "clearedToolUses": 0}
    rows = [
        (1, "MODEL", orjson.dumps({"model": "m", "context": context}).decode(),
         orjson.dumps([{"type": "compaction", "content": "earlier"}, {"type": "text", "text": "hi"}]).decode()),
        (2, "COMPACT", orjson.dumps(summarised).decode(), "The user asked to read the logs; three were read."),
        (3, "COMPACT", orjson.dumps(cleared).decode(),
         orjson.dumps([{"toolUseId": "t1", "tool": "lookup", "seq": 3}, {"toolUseId": "t2", "tool": "lookup",
                                                                         "seq": 5}]).decode()),
    ]
    for seq, kind, request, response in rows:
        await db.execute("INSERT INTO run_step (run_id, seq, kind, status, request, response, started_at, "
                         "finished_at) VALUES (%s, %s, %s, 'DONE', %s, %s, now(), now())",
                         (run_id, seq, kind, request, response))
    timeline = (await client.get(f"/api/runs/{run_id}/timeline")).json()
    assert [s["kind"] for s in timeline] == ["MODEL", "COMPACT", "COMPACT"]
    assert timeline[0]["compaction"] is None and "request" not in timeline[0]
    assert timeline[1]["compaction"] == summarised and timeline[1]["toolName"] is None
    assert timeline[2]["compaction"] == {**cleared, "cleared": 2}
    model = (await client.get(f"/api/runs/{run_id}/steps/1")).json()
    assert model["context"] == context
    detail = (await client.get(f"/api/runs/{run_id}/steps/2")).json()
    assert detail["kind"] == "COMPACT" and detail["compaction"] == summarised
    assert detail["response"].startswith("The user asked")


@pytest.mark.usefixtures("restore_logging")
async def test_the_cli_flag_takes_a_strategy_or_an_object(
    server_url: str, store: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    import json
    import uuid

    from tests.support.cli import agentrun

    code, out, err = await agentrun(capsys, "runs", "submit", "long", "--url", server_url,
                                    "--context-management", "summarize", "--json")
    assert code == 0, err
    run = await store.get(uuid.UUID(json.loads(out)["id"]))
    assert run.context_management == {"strategy": "summarize", "keepRecentTurns": 2}
    code, out, err = await agentrun(capsys, "runs", "submit", "long", "--url", server_url, "--json",
                                    "--context-management", '{"strategy": "clear_tool_results", "keepRecentTurns": 3}')
    assert code == 0, err
    run_id = json.loads(out)["id"]
    assert (await store.get(uuid.UUID(run_id))).context_management == {"strategy": "clear_tool_results",
                                                                      "keepRecentTurns": 3}
    code, out, err = await agentrun(capsys, "runs", "get", run_id, "--url", server_url)
    assert code == 0 and "clear_tool_results keepRecentTurns=3" in out, out + err
    for bad, words in [("fold", "--context-management.strategy must be one of"),
                       ('{"strategy": "none", "keepRecentTurns": -1}', "--context-management.keepRecentTurns"),
                       ("{not json", "is not a JSON object")]:
        with pytest.raises(SystemExit) as exit:
            await agentrun(capsys, "runs", "submit", "x", "--url", server_url, "--context-management", bad)
        assert exit.value.code == 2 and words in capsys.readouterr().err
