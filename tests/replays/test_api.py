"""The /api/replays routes over a real database: a replay made of listed or selected runs, its report scored once
per pair as its runs finish (driven to an end here through the database, as a worker would leave them), the
replay runs kept out of the runs list unless asked for, and every bad request a 4xx naming its field."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import psycopg
import pytest

from agentrun.worker.api.app import create_app
from agentrun.worker.core.replays import RunView
from agentrun.worker.obs.metrics import Metrics
from agentrun.worker.settings import WorkerSettings
from agentrun.worker.store import RunStore
from tests.replays.conftest import recorded
from tests.support.api import toolbox  # noqa: F401  (a fixture)
from tests.support.builders import MODEL
from tests.support.serving import asgi_client
from tests.support.tenants import auth, write_identities

CALLS = [("charge", {"amount": 5, "to": "bob"}, "charged 5"), ("lookup", {"q": "x"}, "found x")]
SCORERS = ("tests.replays.test_api:cheaper", "tests.replays.test_api:raises", "tests.replays.test_api:counted",
           "tests.replays.test_api:garbage", "tests.replays.test_api:judge", "tests.replays.test_api:opinionless")

# -- the custom scorers the app is configured with (AGENTRUN_REPLAY_SCORERS) ------------------------------------

judged: list[uuid.UUID] = []
_judged_lock = threading.Lock()


def cheaper(recorded: RunView, replayed: RunView) -> dict[str, Any]:
    return {"pass": replayed.tokens <= recorded.tokens, "saved": recorded.tokens - replayed.tokens}


def raises(recorded: RunView, replayed: RunView) -> bool:
    raise RuntimeError("the judge is out")


def garbage(recorded: RunView, replayed: RunView) -> Any:
    return "maybe"


async def judge(recorded: RunView, replayed: RunView) -> dict[str, Any]:
    """An LLM judge would await its model here."""
    await asyncio.sleep(0)
    return {"pass": replayed.output == recorded.output, "reason": "same answer"}


class Judge:
    """A scorer object whose __call__ is a coroutine."""

    async def __call__(self, recorded: RunView, replayed: RunView) -> bool:
        raise ValueError("no opinion")


opinionless = Judge()


def counted(recorded: RunView, replayed: RunView) -> bool:
    with _judged_lock:
        judged.append(replayed.id)
    return True


@pytest.fixture
async def http(store: RunStore, toolbox: Any) -> AsyncIterator[httpx.AsyncClient]:  # noqa: F811
    settings = WorkerSettings(database_url="unused", worker_id="api-test", default_model=MODEL, replay_scorers=SCORERS)
    async with asgi_client(create_app(store, toolbox, settings, Metrics())) as client:
        yield client


async def finish(db: psycopg.AsyncConnection[Any], run_id: str | uuid.UUID, calls: list[tuple[str, Any, str]],
                 answer: Any = "done", status: str = "SUCCEEDED", tokens: int = 0) -> None:
    """End a replay run as a worker would: a MODEL step per call (with its TOOL step), a last MODEL step."""
    seq = 0
    for i, (tool, tool_input, result) in enumerate(calls):
        content = [{"type": "tool_use", "id": f"toolu_{i}", "name": tool, "input": tool_input}]
        await db.execute("""INSERT INTO run_step (run_id, seq, kind, status, request, response, stop_reason)
                            VALUES (%s, %s, 'MODEL', 'DONE', '{}', %s, 'tool_use')""", (run_id, seq + 1, json.dumps(content)))
        await db.execute("""INSERT INTO run_step (run_id, seq, kind, status, tool_name, tool_use_id, request, response)
                            VALUES (%s, %s, 'TOOL', 'DONE', %s, %s, %s, %s)""",
                         (run_id, seq + 2, tool, f"toolu_{i}", json.dumps(tool_input), result))
        seq += 2
    await db.execute("""INSERT INTO run_step (run_id, seq, kind, status, request, response, stop_reason)
                        VALUES (%s, %s, 'MODEL', 'DONE', '{}', %s, 'end_turn')""",
                     (run_id, seq + 1, json.dumps([{"type": "text", "text": str(answer)}])))
    await db.execute("""UPDATE run SET status = %s, started_at = now() - interval '1 second', finished_at = now(),
                            output = %s::jsonb, tokens_used = %s WHERE id = %s""",
                     (status, json.dumps(answer), tokens, run_id))


async def make(http: httpx.AsyncClient, body: dict[str, Any], **headers: str) -> dict[str, Any]:
    r = await http.post("/api/replays", json=body, headers=headers)
    assert r.status_code == 201, r.text
    return dict(r.json())


async def report(http: httpx.AsyncClient, replay_id: str, **headers: str) -> dict[str, Any]:
    r = await http.get(f"/api/replays/{replay_id}", headers=headers)
    assert r.status_code == 200, r.text
    return dict(r.json())


def by_recorded(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["recordedRunId"]: r for r in report["results"]}


async def test_a_replay_of_listed_runs_is_reported_as_its_runs_finish(
    http: httpx.AsyncClient, store: RunStore, db: psycopg.AsyncConnection[Any],
) -> None:
    a = await recorded(store, db, CALLS, input="pay bob")
    b = await recorded(store, db, CALLS[:1], input="pay ann")
    await db.execute("UPDATE run SET tokens_used = 100 WHERE id IN (%s, %s)", (a.id, b.id))
    made = await make(http, {"runs": [str(a.id), str(b.id)], "change": {"model": "claude-haiku-4-5"},
                             "toolPolicy": "recorded"})
    assert made["runs"] == 2
    first = await report(http, made["id"])
    assert (first["status"], first["passRate"], first["runs"], first["finished"]) == ("RUNNING", None, 2, 0)
    assert [r["recordedRunId"] for r in first["results"]] == [str(a.id), str(b.id)]  # the order asked
    assert all(r["status"] == "QUEUED" and r["pass"] is None and r["diff"] is None for r in first["results"])
    assert first["change"] == {"model": "claude-haiku-4-5"} and first["scorer"] == "same_tool_calls"
    assert first["toolPolicy"] == "recorded" and first["tokens"] == {"recorded": 200, "replayed": 0}

    runs = by_recorded(first)
    ra, rb = runs[str(a.id)]["replayRunId"], runs[str(b.id)]["replayRunId"]
    await finish(db, ra, CALLS, tokens=40)  # the same calls: a pass
    half = await report(http, made["id"])
    assert (half["status"], half["passRate"], half["finished"]) == ("RUNNING", 1.0, 1)
    await finish(db, rb, [("refund", {"to": "ann"}, "refunded")], tokens=60)  # another call: a fail
    done = await report(http, made["id"])
    assert (done["status"], done["passRate"]) == ("COMPLETED", 0.5)
    ok, bad = by_recorded(done)[str(a.id)], by_recorded(done)[str(b.id)]
    assert (ok["pass"], ok["status"], ok["diff"]["toolCalls"]["distance"]) == (True, "SUCCEEDED", 0)
    assert (bad["pass"], bad["diff"]["toolCalls"]["distance"]) == (False, 1)
    assert bad["diff"]["toolCalls"]["recorded"] == ["charge"] and bad["diff"]["toolCalls"]["replayed"] == ["refund"]
    assert ok["diff"]["tokens"] == {"recorded": 100, "replayed": 40} and ok["diff"]["latencyMs"]["replayed"] >= 1000
    assert done["tokens"] == {"recorded": 200, "replayed": 100}
    # Each pair was scored once: reading again changes nothing.
    stored = await (await db.execute("SELECT replay_run_id, scored_at FROM replay_result ORDER BY 1")).fetchall()
    assert len(stored) == 2
    assert await report(http, made["id"]) == done
    assert await (await db.execute("SELECT replay_run_id, scored_at FROM replay_result ORDER BY 1")).fetchall() == stored


async def test_replay_runs_are_left_out_of_the_runs_list_unless_asked_for(
    http: httpx.AsyncClient, store: RunStore, db: psycopg.AsyncConnection[Any],
) -> None:
    a = await recorded(store, db, CALLS)
    made = await make(http, {"runs": [str(a.id)]})
    replay_run = (await report(http, made["id"]))["results"][0]["replayRunId"]

    async def listed(query: str = "") -> list[str]:
        r = await http.get(f"/api/runs{query}")
        assert r.status_code == 200, r.text
        return [item["id"] for item in r.json()["items"]]

    assert await listed() == [str(a.id)]
    assert set(await listed("?replays=true")) == {str(a.id), replay_run}
    assert await listed(f"?replayId={made['id']}") == [replay_run]
    assert await listed(f"?replayOf={a.id}") == [replay_run]
    view = (await http.get(f"/api/runs/{replay_run}")).json()
    assert (view["replayOf"], view["replayId"], view["origin"]) == (str(a.id), made["id"], "replay")
    summary = (await http.get("/api/runs?replays=true&limit=1")).json()["items"][0]
    assert (summary["replayOf"], summary["replayId"]) == (str(a.id), made["id"])
    assert (await http.get(f"/api/runs/{a.id}")).json()["replayOf"] is None


async def test_a_selector_finds_the_tenants_finished_runs_never_a_replays(
    http: httpx.AsyncClient, store: RunStore, db: psycopg.AsyncConnection[Any],
) -> None:
    billing = [await recorded(store, db, CALLS, labels={"team": "billing"}) for _ in range(3)]
    await recorded(store, db, CALLS, labels={"team": "ops"})
    await recorded(store, db, CALLS, labels={"team": "billing"}, status="FAILED")
    queued = await store.create(__import__("tests.support.builders", fromlist=["new_run"]).new_run(
        labels={"team": "billing"}))
    assert queued[0].status.value == "QUEUED"

    made = await make(http, {"selector": {"labels": "team=billing", "status": ["SUCCEEDED"]}})
    assert made["runs"] == 3
    found = await report(http, made["id"])
    assert {r["recordedRunId"] for r in found["results"]} == {str(r.id) for r in billing}
    assert found["selector"]["labels"] == "team=billing"
    # Its own runs are never selected again; an object of labels, a limit.
    again = await make(http, {"selector": {"labels": {"team": "billing"}, "limit": 2}})
    assert again["runs"] == 2
    everything = await make(http, {"selector": {}, "toolPolicy": "recorded_then_live_readonly"})
    assert everything["runs"] == 5  # every finished run, replays' runs left out
    assert (await report(http, everything["id"]))["toolPolicy"] == "recorded_then_live_readonly"


@pytest.mark.parametrize(("body", "status", "field"), [
    ({}, 422, "body"),
    ({"runs": [str(uuid.UUID(int=1))], "selector": {}}, 422, "body"),
    ({"runs": []}, 422, "runs"),
    ({"runs": ["not-a-uuid"]}, 422, "runs[0]"),
    ({"runs": [str(uuid.UUID(int=1))]}, 404, "runs[0]"),
    ({"selector": {"labels": "team=nobody"}}, 422, "selector"),
    ({"selector": {"labels": "team in"}}, 422, "selector.labels"),
    ({"selector": {"status": ["RUNNING"]}}, 422, "selector.status[0]"),
    ({"selector": {"limit": 1001}}, 422, "selector.limit"),
    ({"selector": {"since": "2026-01-01T00:00:00"}}, 422, "selector.since"),
    ({"selector": {}, "scorer": "vibes"}, 422, "scorer"),
    ({"selector": {}, "scorer": "os:system"}, 422, "scorer"),
    ({"selector": {}, "toolPolicy": "live"}, 422, "toolPolicy"),
    ({"selector": {}, "fromSeq": 1}, 422, "fromSeq"),
    ({"selector": {}, "change": {"colour": "red"}}, 422, "change.colour"),
    ({"selector": {}, "change": {"agent": "no such@x"}}, 422, "change.agent"),
])
async def test_a_bad_request_is_a_4xx_naming_the_field_and_makes_nothing(
    http: httpx.AsyncClient, store: RunStore, db: psycopg.AsyncConnection[Any], body: dict[str, Any], status: int,
    field: str,
) -> None:
    await recorded(store, db, CALLS)
    r = await http.post("/api/replays", json=body)
    assert r.status_code == status, r.text
    fields = [f["field"] for f in r.json()["fields"]]
    assert field in fields, r.text
    assert (await (await db.execute("SELECT count(*) FROM replay")).fetchone()) == (0,)


async def test_runs_that_cannot_be_replayed(
    http: httpx.AsyncClient, store: RunStore, db: psycopg.AsyncConnection[Any],
) -> None:
    from tests.support.builders import new_run

    done = await recorded(store, db, CALLS)
    queued, _ = await store.create(new_run())
    r = await http.post("/api/replays", json={"runs": [str(done.id), str(queued.id)]})
    assert r.status_code == 409 and r.json()["fields"][0]["field"] == "runs[1]", r.text
    r = await http.post("/api/replays", json={"runs": [str(done.id), str(done.id)]})
    assert r.status_code == 422 and r.json()["fields"][0]["field"] == "runs[1]", r.text
    made = await make(http, {"runs": [str(done.id)]})
    replay_run = (await report(http, made["id"]))["results"][0]["replayRunId"]
    await finish(db, replay_run, CALLS)
    r = await http.post("/api/replays", json={"runs": [replay_run]})
    assert r.status_code == 422 and str(done.id) in r.json()["fields"][0]["problem"], r.text
    assert (await http.get(f"/api/replays/{uuid.uuid4()}")).status_code == 404


async def test_the_idempotency_key_returns_the_first_replay(
    http: httpx.AsyncClient, store: RunStore, db: psycopg.AsyncConnection[Any],
) -> None:
    a = await recorded(store, db, CALLS)
    body = {"runs": [str(a.id)], "change": {"system": "be brief"}}
    first = await http.post("/api/replays", json=body, headers={"Idempotency-Key": "ci-42"})
    again = await http.post("/api/replays", json=body, headers={"Idempotency-Key": "ci-42"})
    assert first.status_code == again.status_code == 201
    assert first.json() == again.json() and again.headers["Idempotent-Replayed"] == "true"
    other = await http.post("/api/replays", json={**body, "change": {"system": "be long"}},
                            headers={"Idempotency-Key": "ci-42"})
    assert other.status_code == 422 and other.json()["fields"][0]["field"] == "Idempotency-Key"
    assert (await (await db.execute("SELECT count(*) FROM run WHERE replay_id IS NOT NULL")).fetchone()) == (1,)


async def test_the_built_in_scorers(http: httpx.AsyncClient, store: RunStore, db: psycopg.AsyncConnection[Any]) -> None:
    a = await recorded(store, db, CALLS, answer="42", output_schema={"type": "string"})
    verdicts = {}
    for scorer in ("exact", "schema_valid", "same_tool_calls"):
        made = await make(http, {"runs": [str(a.id)], "scorer": scorer})
        await finish(db, (await report(http, made["id"]))["results"][0]["replayRunId"], CALLS[:1], answer="43")
        verdicts[scorer] = (await report(http, made["id"]))["results"][0]
    assert verdicts["exact"]["pass"] is False and verdicts["exact"]["diff"]["output"]["equal"] is False
    assert verdicts["schema_valid"]["pass"] is True
    assert verdicts["same_tool_calls"]["pass"] is False


async def test_custom_scorers_and_their_failures(
    http: httpx.AsyncClient, store: RunStore, db: psycopg.AsyncConnection[Any],
) -> None:
    a = await recorded(store, db, CALLS)
    await db.execute("UPDATE run SET tokens_used = 100 WHERE id = %s", (a.id,))
    results = {}
    for scorer in ("cheaper", "raises", "garbage", "judge", "opinionless"):
        made = await make(http, {"runs": [str(a.id)], "scorer": f"tests.replays.test_api:{scorer}"})
        await finish(db, (await report(http, made["id"]))["results"][0]["replayRunId"], CALLS, tokens=30)
        results[scorer] = (await report(http, made["id"]))
    assert results["cheaper"]["passRate"] == 1.0
    assert results["cheaper"]["results"][0]["diff"]["scorerDetail"] == {"saved": 70}
    assert results["judge"]["results"][0]["diff"]["scorerDetail"] == {"reason": "same answer"}
    assert results["judge"]["passRate"] == 1.0
    for broken, said in (("raises", "RuntimeError: the judge is out"), ("garbage", "returned 'maybe'"),
                         ("opinionless", "ValueError: no opinion")):
        result = results[broken]["results"][0]
        assert result["pass"] is False and said in result["diff"]["scorerError"], result
        assert results[broken]["status"] == "COMPLETED" and results[broken]["passRate"] == 0.0


async def test_concurrent_readers_score_each_pair_once(
    http: httpx.AsyncClient, store: RunStore, db: psycopg.AsyncConnection[Any],
) -> None:
    runs = [await recorded(store, db, CALLS) for _ in range(4)]
    made = await make(http, {"runs": [str(r.id) for r in runs], "scorer": "tests.replays.test_api:counted"})
    for result in (await report(http, made["id"]))["results"]:
        await finish(db, result["replayRunId"], CALLS)
    judged.clear()
    reports = await asyncio.gather(*(report(http, made["id"]) for _ in range(6)))
    assert all(r["status"] == "COMPLETED" and r["passRate"] == 1.0 for r in reports)
    assert sorted(map(str, judged)) == sorted(r["replayRunId"] for r in reports[0]["results"])


async def test_a_slow_scorer_judges_over_several_reads(
    http: httpx.AsyncClient, store: RunStore, db: psycopg.AsyncConnection[Any], monkeypatch: pytest.MonkeyPatch,
) -> None:
    from agentrun.worker.api import replays

    monkeypatch.setattr(replays, "SCORING_BUDGET", 0.0)  # one pair per read
    runs = [await recorded(store, db, CALLS) for _ in range(3)]
    made = await make(http, {"runs": [str(r.id) for r in runs]})
    for result in (await report(http, made["id"]))["results"]:
        await finish(db, result["replayRunId"], CALLS)
    seen = [await report(http, made["id"]) for _ in range(3)]
    assert [(r["status"], r["finished"], r["scored"]) for r in seen] == [
        ("RUNNING", 3, 1), ("RUNNING", 3, 2), ("COMPLETED", 3, 3)]
    assert seen[-1]["passRate"] == 1.0


async def test_a_recorded_run_pruned_since_is_said_so(
    http: httpx.AsyncClient, store: RunStore, db: psycopg.AsyncConnection[Any],
) -> None:
    a, b = await recorded(store, db, CALLS), await recorded(store, db, CALLS)
    made = await make(http, {"runs": [str(a.id), str(b.id)]})
    for result in (await report(http, made["id"]))["results"]:
        await finish(db, result["replayRunId"], CALLS)
    await db.execute("DELETE FROM run_step WHERE run_id = %s", (a.id,))
    await db.execute("DELETE FROM run WHERE id = %s", (a.id,))
    done = await report(http, made["id"])
    gone, kept = by_recorded(done)[str(a.id)], by_recorded(done)[str(b.id)]
    assert gone["pass"] is None and gone["diff"]["recordedMissing"] is True and "pruned" in gone["diff"]["error"]
    assert kept["pass"] is True and (done["status"], done["passRate"]) == ("COMPLETED", 1.0)


async def test_the_list_of_replays(http: httpx.AsyncClient, store: RunStore, db: psycopg.AsyncConnection[Any]) -> None:
    a = await recorded(store, db, CALLS)
    made = [await make(http, {"runs": [str(a.id)], "change": {"model": m}}) for m in ("m-1", "m-2", "m-3")]
    page = (await http.get("/api/replays?limit=2")).json()
    assert [r["id"] for r in page["items"]] == [made[2]["id"], made[1]["id"]] and page["next"] == made[1]["id"]
    assert page["items"][0]["change"] == {"model": "m-3"} and page["items"][0]["status"] == "RUNNING"
    rest = (await http.get(f"/api/replays?limit=2&after={page['next']}")).json()
    assert [r["id"] for r in rest["items"]] == [made[0]["id"]] and rest["next"] is None
    r = await http.get(f"/api/replays?after={uuid.uuid4()}")
    assert r.status_code == 422 and r.json()["fields"][0]["field"] == "after"


async def test_a_replay_is_its_tenants(store: RunStore, db: psycopg.AsyncConnection[Any], toolbox: Any,  # noqa: F811
                                       tmp_path: Any) -> None:
    settings = WorkerSettings(database_url="unused", default_model=MODEL,
                              api_tokens_file=str(write_identities(tmp_path / "tokens.json")))
    async with asgi_client(create_app(store, toolbox, settings, Metrics())) as http:
        theirs = await recorded(store, db, CALLS, tenant="team-a")
        r = await http.post("/api/replays", json={"runs": [str(theirs.id)]}, headers=auth("bob"))
        assert r.status_code == 404 and r.json()["fields"][0]["field"] == "runs[0]", r.text
        r = await http.post("/api/replays", json={"selector": {}}, headers=auth("bob"))
        assert r.status_code == 422 and r.json()["fields"][0]["field"] == "selector", r.text
        made = await make(http, {"selector": {}}, **auth("alice"))
        assert (await http.get(f"/api/replays/{made['id']}", headers=auth("bob"))).status_code == 404
        assert (await http.get("/api/replays", headers=auth("bob"))).json()["items"] == []
        assert (await report(http, made["id"], **auth("carol")))["tenant"] == "team-a"
        assert [r["id"] for r in (await http.get("/api/replays", headers=auth("root"))).json()["items"]] == [made["id"]]
        r = await http.post("/api/replays", json={"selector": {}}, headers=auth("carol"))
        assert r.status_code == 403  # read only
