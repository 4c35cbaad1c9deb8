"""The `webhook` of a run request through the REST API: checked at submission (422 naming the field), shown
in the run's JSON, inherited by continuations and forks, and its deliveries at GET /api/runs/{id}/webhooks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from agentrun.worker.settings import WorkerSettings
from tests.support.builders import MODEL
from tests.webhooks.receiver import SECRETS_FILE

BODY = {"input": "pay the invoice", "tokenBudget": 1000, "timeoutSeconds": 60}
HOOK = {"url": "https://hooks.example.com/agentrun", "events": ["finished"], "secretRef": "hooks"}


@pytest.fixture
def settings(tmp_path: Path) -> WorkerSettings:
    path = tmp_path / "secrets.json"
    path.write_text(SECRETS_FILE)
    return WorkerSettings(database_url="unused", worker_id="api-test", default_model=MODEL,
                          webhook_secrets_file=str(path))


def problems(r: httpx.Response) -> dict[str, str]:
    return {p["field"]: p["problem"] for p in r.json()["fields"]}


@pytest.mark.parametrize(("webhook", "field"), [
    ({**HOOK, "url": "http://169.254.169.254/latest/meta-data/"}, "webhook.url"),
    ({**HOOK, "url": "http://[fd00:ec2::254]/"}, "webhook.url"),
    ({**HOOK, "url": "http://127.0.0.1:8080/"}, "webhook.url"),
    ({**HOOK, "url": "ftp://example.com/"}, "webhook.url"),
    ({**HOOK, "secretRef": "other"}, "webhook.secretRef"),
    ({**HOOK, "events": ["done"]}, "webhook.events"),
    ({**HOOK, "events": []}, "webhook.events"),
    ({"url": HOOK["url"]}, "webhook.secretRef"),
    ({**HOOK, "extra": 1}, "webhook.extra"),
])
async def test_a_bad_webhook_is_422_naming_the_field(
    client: httpx.AsyncClient, db: psycopg.AsyncConnection[Any], webhook: dict[str, Any], field: str
) -> None:
    r = await client.post("/api/runs", json={**BODY, "webhook": webhook})
    assert r.status_code == 422, r.text
    assert any(f.startswith(field) for f in problems(r)), r.text
    assert "Traceback" not in r.text
    assert await (await db.execute("SELECT count(*) FROM run")).fetchone() == (0,)


async def test_the_run_shows_its_webhook_and_its_deliveries(
    client: httpx.AsyncClient, db: psycopg.AsyncConnection[Any]
) -> None:
    r = await client.post("/api/runs", json={**BODY, "webhook": {**HOOK, "events": ["finished", "waiting"]}})
    assert r.status_code == 201, r.text
    run_id = r.json()["id"]
    run = (await client.get(f"/api/runs/{run_id}")).json()
    assert run["webhook"] == {**HOOK, "events": ["finished", "waiting"]}
    assert (await client.get(f"/api/runs/{run_id}/webhooks")).json() == []
    assert (await client.post(f"/api/runs/{run_id}/cancel")).status_code == 202
    [d] = (await client.get(f"/api/runs/{run_id}/webhooks")).json()
    assert d["id"].startswith("msg_") and (d["event"], d["runStatus"], d["state"]) == ("finished", "CANCELLED", "PENDING")
    assert d["url"] == HOOK["url"] and d["history"] == [] and d["nextAttemptAt"]
    assert (await client.get("/api/runs/00000000-0000-0000-0000-000000000000/webhooks")).status_code == 404


async def test_continuations_and_forks_inherit_the_webhook_unless_they_name_one(
    client: httpx.AsyncClient, db: psycopg.AsyncConnection[Any]
) -> None:
    r = await client.post("/api/runs", json={**BODY, "webhook": HOOK})
    source = r.json()["id"]
    await db.execute("UPDATE run SET status = 'SUCCEEDED', finished_at = now(), output = to_jsonb('ok'::text) "
                     "WHERE id = %s", (source,))
    await db.execute("INSERT INTO run_step (run_id, seq, kind, status, response, started_at, finished_at) "
                     "VALUES (%s, 1, 'USER', 'DONE', '\"pay\"', now(), now())", (source,))
    cont = (await client.post("/api/runs", json={"continueFrom": source, "input": "and then?"})).json()["id"]
    fork = (await client.post("/api/runs", json={"forkFrom": {"runId": source, "seq": 1}})).json()["id"]
    other = {**HOOK, "url": "https://elsewhere.example.com/"}
    own = (await client.post("/api/runs", json={"continueFrom": source, "input": "x", "webhook": other})).json()["id"]
    assert (await client.get(f"/api/runs/{cont}")).json()["webhook"] == HOOK
    assert (await client.get(f"/api/runs/{fork}")).json()["webhook"] == HOOK
    assert (await client.get(f"/api/runs/{own}")).json()["webhook"] == other


async def test_a_retry_with_another_webhook_is_not_the_same_request(client: httpx.AsyncClient) -> None:
    headers = {"Idempotency-Key": "k-1"}
    first = await client.post("/api/runs", json={**BODY, "webhook": HOOK}, headers=headers)
    again = await client.post("/api/runs", json={**BODY, "webhook": HOOK}, headers=headers)
    other = await client.post("/api/runs", json={**BODY, "webhook": {**HOOK, "url": "https://x.example.com/"}},
                              headers=headers)
    assert (first.status_code, again.status_code, again.headers.get("Idempotent-Replayed")) == (201, 201, "true")
    assert other.status_code == 422, other.text


async def test_an_agents_webhook_is_its_runs_unless_they_name_their_own(client: httpx.AsyncClient) -> None:
    bad = await client.post("/api/agents", json={"name": "payer", "webhook": {**HOOK, "url": "http://10.0.0.1/"}})
    assert bad.status_code == 422 and "webhook.url" in problems(bad), bad.text
    r = await client.post("/api/agents", json={"name": "payer", "webhook": HOOK, "tokenBudget": 1000,
                                               "timeoutSeconds": 60})
    assert r.status_code == 201, r.text
    assert (await client.get("/api/agents/payer")).json()["webhook"] == HOOK
    same = (await client.post("/api/runs", json={"agent": "payer", "input": "x"})).json()["id"]
    other = {**HOOK, "url": "https://mine.example.com/"}
    own = (await client.post("/api/runs", json={"agent": "payer", "input": "x", "webhook": other})).json()["id"]
    assert (await client.get(f"/api/runs/{same}")).json()["webhook"] == HOOK
    assert (await client.get(f"/api/runs/{own}")).json()["webhook"] == other


async def test_a_schedules_run_template_may_name_a_webhook_checked_as_a_runs_is(
    client: httpx.AsyncClient, store: Any, db: psycopg.AsyncConnection[Any]
) -> None:
    from agentrun.worker.runtime.schedules import Ticker

    bad = await client.post("/api/schedules", json={
        "name": "leaky", "intervalSeconds": 3600,
        "run": {**BODY, "webhook": {**HOOK, "url": "http://169.254.169.254/latest/meta-data/"}}})
    assert bad.status_code == 422 and "run.webhook.url" in problems(bad), bad.text
    made = await client.post("/api/schedules", json={"name": "hooked", "intervalSeconds": 3600,
                                                      "run": {**BODY, "webhook": HOOK}})
    assert made.status_code == 201, made.text
    await db.execute("UPDATE schedule SET next_due_at = date_trunc('second', now()) WHERE name = 'hooked'")
    assert [t.outcome for t in await Ticker(store, "t1", MODEL).once()] == ["created"]
    [run] = (await client.get("/api/schedules/hooked/runs")).json()
    assert (await client.get(f"/api/runs/{run['id']}")).json()["webhook"] == HOOK


@pytest.mark.parametrize("url", ["http://ａ.example/h", "http://Ⅻ.example/h", "http://999.1.1.1/h"])
async def test_a_url_the_sender_could_not_send_to_is_422_at_submission(
    client: httpx.AsyncClient, db: psycopg.AsyncConnection[Any], url: str
) -> None:
    """Hosts the URL policy took but the sender's HTTP client refuses (IDNA 2008, an IPv4-style name that is
    no address) are refused up front, not left to fail every attempt for a day."""
    r = await client.post("/api/runs", json={**BODY, "webhook": {**HOOK, "url": url}})
    assert r.status_code == 422, r.text
    assert list(problems(r)) == ["webhook.url"], r.text
    assert await (await db.execute("SELECT count(*) FROM run")).fetchone() == (0,)
