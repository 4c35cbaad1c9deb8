"""The REST API fuzzed from its own OpenAPI document (schemathesis) against a real uvicorn and PostgreSQL.

Every generated request, valid or not: no 5xx, status code, content type, headers and body as the
document says, valid data accepted and invalid data refused. After every accepted write the run must
still read back (`GET /api/runs/{id}`, its timeline, the list) with bodies the document allows.
The same again with a bearer token configured: every /api call without it is a 401.

Bounded and deterministic here (derandomized, a fixed number of examples per operation); for a deeper
run raise the number: `AGENTRUN_FUZZ_EXAMPLES=1000 .venv/bin/python -m pytest tests/api/test_fuzz.py`.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import urllib.parse
import uuid
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import httpx
import psycopg
import pytest
import schemathesis
import uvicorn
from hypothesis import HealthCheck, settings
from psycopg import sql
from psycopg.conninfo import make_conninfo
from schemathesis.config import SchemathesisConfig
from schemathesis.specs.openapi.checks import positive_data_acceptance

from agentrun.worker.api.app import create_app
from agentrun.worker.obs.metrics import Metrics
from agentrun.worker.settings import WorkerSettings
from agentrun.worker.store import RunStore
from agentrun.worker.store.pool import open_pool
from agentrun.worker.testing.scripted import TurnBasedLlm
from agentrun.worker.tools import ToolBox
from tests.conftest import TEMPLATE
from tests.support.api import broken, lookup, noop
from tests.support.builders import MODEL, new_run, worker

EXAMPLES = int(os.environ.get("AGENTRUN_FUZZ_EXAMPLES", "30"))
TOKEN = "fuzz-token-0123456789"
TOOLS = (noop, lookup, broken)

FUZZ = settings(
    max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
    suppress_health_check=list(HealthCheck), print_blob=False,
)


def _settings(token: str | None) -> WorkerSettings:
    return WorkerSettings(database_url="unused", worker_id="fuzz", default_model=MODEL, api_token=token)


def _document(token: str | None) -> dict[str, Any]:
    """The document the app serves; building it needs no database."""
    app = create_app(RunStore(None), ToolBox(TOOLS), _settings(token), Metrics())  # type: ignore[arg-type]
    return app.openapi()


open_api = schemathesis.openapi.from_dict(_document(None))
# The token given the way schemathesis knows it is auth, so a negative case that drops it stays dropped.
guarded_api = schemathesis.openapi.from_dict(
    _document(TOKEN), config=SchemathesisConfig.from_dict({"auth": {"openapi": {"HTTPBearer": {"bearer": TOKEN}}}})
)


class LiveApi:
    """The worker's app in a real uvicorn, in a thread with its own event loop and connection pool,
    so schemathesis's blocking HTTP calls reach it over a socket like any client's."""

    def __init__(self, database_url: str, token: str | None) -> None:
        self.database_url, self.token = database_url, token
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        # The test's own reads. No keep-alive: on a socket bound here (not by uvicorn) accepted connections
        # lack TCP_NODELAY, and each reused-connection request would stall ~40 ms on delayed ACKs.
        self.http = httpx.Client(base_url=self.url, timeout=30, limits=httpx.Limits(max_keepalive_connections=0))
        self.auth = {"Authorization": f"Bearer {token}"} if token else {}
        self.seeded: list[uuid.UUID] = []
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._server: uvicorn.Server | None = None
        self._thread = threading.Thread(target=self._main, name="fuzz-api", daemon=True)

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as e:  # handed to the test thread
            self._error = e
            self._ready.set()

    async def _seed(self, store: RunStore) -> None:
        """Runs in each state with real steps (a tool error among them), so reads return full bodies."""
        done, _ = await store.create(new_run("finished with a failing tool", tools=("broken",)))
        await worker(store, TurnBasedLlm(turns=2, tool="broken"), list(TOOLS), name="fuzz-seed").run_once()
        queued, _ = await store.create(new_run("waiting", cost_budget_usd=Decimal("1.5")))
        cancelled, _ = await store.create(new_run("cancelled"))
        await store.cancel(cancelled.id)
        self.seeded = [done.id, queued.id, cancelled.id]

    async def _serve(self) -> None:
        pool = await open_pool(self.database_url, max_size=4)
        try:
            store = RunStore(pool)
            await self._seed(store)
            app = create_app(store, ToolBox(TOOLS), _settings(self.token),
                             Metrics(count_runs=store.count_by_status, cache_seconds=0))
            self._server = uvicorn.Server(uvicorn.Config(app, log_config=None, access_log=False, lifespan="off"))
            serving = asyncio.create_task(self._server.serve(sockets=[self.sock]))
            while not self._server.started and not serving.done():
                await asyncio.sleep(0.01)
            self._ready.set()
            await serving
        finally:
            await pool.close()

    def __enter__(self) -> LiveApi:
        self._thread.start()
        assert self._ready.wait(60), "the API did not start"
        if self._error is not None:
            raise self._error
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.should_exit = True
        self._thread.join(30)
        self.sock.close()
        self.http.close()


def _live(postgres_url: str, name: str, token: str | None) -> Iterator[LiveApi]:
    """One database for the module: what one fuzzed request leaves behind, the next ones read."""
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name), sql.Identifier(TEMPLATE)))
    try:
        with LiveApi(make_conninfo(postgres_url, dbname=name), token) as api:
            yield api
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture(scope="module")
def open_server(postgres_url: str, template_url: str) -> Iterator[LiveApi]:
    yield from _live(postgres_url, f"agentrun_fuzz_open_{uuid.uuid4().hex[:8]}", None)


@pytest.fixture(scope="module")
def guarded_server(postgres_url: str, template_url: str) -> Iterator[LiveApi]:
    yield from _live(postgres_url, f"agentrun_fuzz_guarded_{uuid.uuid4().hex[:8]}", TOKEN)


# Refusals that depend on what is stored, not on the request's shape: no document can rule them out,
# so a schema-valid request may meet them. Each is a 422 naming its field.
STATE_CONFLICTS = {
    ("Idempotency-Key", "was already used for a different request"),
    ("after", "names no run; pass the `next` of a previous page"),
    ("after", "names no replay; pass the `next` of a previous page"),
}
# What a replay is made of is stored state too: runs that are not there (or not finished, or a replay's own), a
# selector that finds none, a change or fromSeq the recorded runs refuse, a scorer the configuration does not list.
REPLAY_FIELDS = ("runs", "selector", "change", "fromSeq", "scorer")
QUERY_GRAMMARS = {"labelSelector", "status", "agent", "createdAfter", "createdBefore", "q", "model", "createdBy"}
# An agent's definition decides these (stored state too): a limit above the agent's, a limit the agent
# leaves to the run and the run leaves out; and a sub-agent naming the agent being defined.
AGENT_CONFLICTS = ("may only lower agent ", "names the agent itself")
# What a JSON Schema (the document's own language) cannot say of an `outputSchema`: that it is itself a
# valid JSON Schema, and that none of its strings holds a NUL (JSONB cannot).
SCHEMA_RULES = {(field, "has a string that contains a NUL character (U+0000), which PostgreSQL text cannot hold")
                for field in ("outputSchema", "payload")}  # payload: POST /api/events


# A schedule's cron expression is read by cron's own rules (ranges, names, steps), which a pattern cannot
# hold; its run template is refused for what a run request is refused for (named `run.<field>`).
CRON_RULES = ("is no valid cron expression", "never matches a time", "must be a standard 5-field cron expression",
              "must be a 5-field cron expression")


def _schedule_rule(response: Any) -> bool:
    body = response.json() if "json" in str(response.headers.get("content-type", "")) else {}
    fields = [(f["field"], f["problem"]) for f in body.get("fields", [])] if isinstance(body, dict) else []
    if response.status_code == 409:  # the name is taken (stored state)
        return True
    if fields and all(f == "cron" and p.startswith(CRON_RULES) for f, p in fields):
        return True
    if not fields or not all(f.startswith("run.") for f, _ in fields):
        return False
    if response.status_code == 422 and all(f in ("run.webhook.url", "run.webhook.secretRef") for f, _ in fields):
        return True  # the URL policy and the configured secrets, as for a run (below)
    if response.status_code == 422 and fields == [("run.tenant", p) for _, p in fields] and all(
            p.startswith("a schedule's runs are its own tenant's") for _, p in fields):
        return True  # the template's tenant against the schedule's (the body's or the caller's): no schema says it
    if response.status_code == 404:
        return all(f == "run.agent" or f.startswith("run.subAgents[") for f, _ in fields)
    if response.status_code == 422 and len(fields) == 1 and fields[0][0] in (
            "run.model", "run.costBudgetUsd", "run.outputSchema"):
        return True  # configuration (providers, prices) or what no pattern says of a schema, as for a run
    sent = response.request.body or b""
    agent_given = b'"agent"' in (sent.encode() if isinstance(sent, str) else sent)
    return response.status_code == 422 and all(
        (f.removeprefix("run."), p) in SCHEMA_RULES or any(p.startswith(c) for c in AGENT_CONFLICTS)
        or (agent_given and f in ("run.tokenBudget", "run.timeoutSeconds") and p == "is required") for f, p in fields)


def _state_conflict(response: Any) -> bool:
    if "/api/schedules" in str(response.request.url):
        return _schedule_rule(response)
    body = response.json() if "json" in str(response.headers.get("content-type", "")) else {}
    fields = {f["field"] for f in body.get("fields", [])} if isinstance(body, dict) else set()
    if urllib.parse.urlsplit(str(response.request.url)).path == "/api/replays" and response.request.method == "POST":
        return response.status_code in (404, 409, 422) and bool(fields) and all(
            f.startswith(REPLAY_FIELDS) for f in fields)
    # A run to continue or fork that is not there, did not succeed, or has fewer steps: stored state.
    if response.status_code == 404 and fields and fields <= {"continueFrom", "forkFrom.runId"}:
        return True
    # An agent or sub-agent that is not stored (or not that version).
    if response.status_code == 404 and fields and all(f == "agent" or f.startswith("subAgents[") for f in fields):
        return True
    if response.status_code == 409 and str(body.get("error", "")).startswith("continueFrom:"):
        return True
    # A decision on a call that is not pending in that way (decided already, or of the other kind).
    if response.status_code == 409 and "/pending/" in response.request.url.path:
        return True
    if response.status_code == 422 and fields == {"forkFrom.seq"}:
        return True
    if response.status_code == 422:
        # A cost budget on a model the price table does not price: the table is configuration, not part
        # of the document, so a schema-valid request may meet this 422 naming its field.
        named = response.json().get("fields", [])
        if len(named) == 1 and named[0]["field"] == "model" and "unknown model provider" in named[0]["problem"]:
            return True  # the same: which providers a `provider/model` prefix may name is configuration
        if len(named) == 1 and named[0]["field"] == "outputSchema" and "is not a valid JSON Schema" in \
                named[0]["problem"]:
            return True
        if len(named) == 1 and named[0]["field"] == "costBudgetUsd" and "no price" in named[0]["problem"]:
            return True
    if response.status_code != 422:
        return False
    fields = {(f["field"], f["problem"]) for f in response.json().get("fields", [])}
    # The runs list's filters read by grammars no pattern states whole (a Kubernetes label selector, statuses
    # in any case, an agent reference, a time's offset, text PostgreSQL can hold): a 422 naming the parameter.
    if "/api/runs" in str(response.request.url) and response.request.method == "GET" and fields and all(
            name in QUERY_GRAMMARS for name, _ in fields):
        return True
    # A webhook's host under the URL policy (AGENTRUN_WEBHOOK_ALLOW) and its secretRef among the configured
    # secrets (AGENTRUN_WEBHOOK_SECRETS) are the server's configuration, as the price table is.
    if fields and all(name in ("webhook.url", "webhook.secretRef") for name, _ in fields):
        return True
    sent = response.request.body or b""
    agent_given = b'"agent"' in (sent.encode() if isinstance(sent, str) else sent)
    return bool(fields) and all(
        f in STATE_CONFLICTS or f in SCHEMA_RULES or any(p.startswith(c) for c in AGENT_CONFLICTS)
        or (agent_given and name in ("tokenBudget", "timeoutSeconds") and p == "is required")
        for f in fields for name, p in (f,))


def _check(case: Any, server: LiveApi) -> None:
    response = case.call(base_url=server.url)
    if server.token and case.path.startswith("/api"):
        # 401 exactly when the right token was not sent (schemathesis sends it, unless a case drops it).
        sent = response.request.headers.get("Authorization")
        assert (response.status_code == 401) == (sent != server.auth["Authorization"]), (sent, response.status_code)
    excluded = [positive_data_acceptance] if _state_conflict(response) else []
    case.validate_response(response, excluded_checks=excluded, transport_kwargs={"base_url": server.url})
    if case.method == "POST" and response.status_code in (201, 202) and case.path.startswith("/api/runs"):
        _reads_still_work(case.operation.schema, server, response.json()["id"])


def _reads_still_work(schema: Any, server: LiveApi, run_id: str) -> None:
    """What was accepted must not break a later read: the run, its timeline and the list all answer 200
    with bodies the document allows."""
    for path, params in (("/api/runs/{id}", None), ("/api/runs/{id}/timeline", None), ("/api/runs", {"limit": 200})):
        r = server.http.get(path.format(id=run_id), params=params, headers=server.auth)
        assert r.status_code == 200, (path, r.status_code, r.text)
        schema[path]["GET"].validate_response(r)
    listed = server.http.get("/api/runs", params={"limit": 200}, headers=server.auth).json()["items"]
    assert run_id in {item["id"] for item in listed} or len(listed) == 200


@open_api.parametrize()
@FUZZ
def test_every_generated_request_is_answered_as_documented(
    case: Any, open_server: LiveApi
) -> None:
    _check(case, open_server)


@guarded_api.parametrize()
@FUZZ
def test_with_a_token_every_generated_request_is_answered_as_documented(
    case: Any, guarded_server: LiveApi
) -> None:
    # The same checks; schemathesis also sends each case without the token and expects a 401 (ignored_auth).
    _check(case, guarded_server)


def test_the_token_guards_every_api_operation_and_nothing_else(guarded_server: LiveApi) -> None:
    for op in guarded_api.get_all_operations():
        operation = op.ok()
        path = operation.path.replace("{id}", str(guarded_server.seeded[0])).replace("{seq}", "1")
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
            r = guarded_server.http.request(operation.method.upper(), path, headers=headers)
            if path.startswith("/api"):
                assert r.status_code == 401, (operation.method, path, headers)
            else:
                assert r.status_code == 200, (operation.method, path, headers, r.text)


def test_seeded_runs_read_back_as_documented(open_server: LiveApi) -> None:
    """Real data (steps, a tool error, a cost budget, a cancelled run) through every read, validated."""
    for run_id in open_server.seeded:
        for path in ("/api/runs/{id}", "/api/runs/{id}/timeline"):
            r = open_server.http.get(path.format(id=run_id))
            assert r.status_code == 200
            open_api[path]["GET"].validate_response(r)
        for step in open_server.http.get(f"/api/runs/{run_id}/timeline").json():
            r = open_server.http.get(f"/api/runs/{run_id}/steps/{step['seq']}")
            assert r.status_code == 200
            open_api["/api/runs/{id}/steps/{seq}"]["GET"].validate_response(r)
    r = open_server.http.get("/api/runs", params={"limit": 1})
    open_api["/api/runs"]["GET"].validate_response(r)
    assert r.json()["next"] is not None
    steps = open_server.http.get(f"/api/runs/{open_server.seeded[0]}/timeline").json()
    assert any(s["kind"] == "TOOL" for s in steps) and steps[-1]["kind"] == "MODEL"
