"""Named identities with scopes over real HTTP: every endpoint × scope (allowed, 403, 401), the tokens
file re-read when it changes, and who created and cancelled each run."""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentrun.worker.api.app import create_app
from agentrun.worker.api.identities import Identities, IdentityFileError, Scope, new_token
from agentrun.worker.core.agents import Agent
from agentrun.worker.core.records import RunStatus
from agentrun.worker.obs.metrics import Metrics
from agentrun.worker.settings import WorkerSettings
from agentrun.worker.store import RunStore
from agentrun.worker.tools import ToolBox
from tests.support.builders import MODEL, new_run
from tests.support.serving import serving
from tests.support.waiting import eventually

DEFAULT_TOKEN = "tok-default-0123456789abcdef"
# One identity per scope, and one holding two; the token of each is its name with a suffix.
IDENTITIES = {
    "reader": ["read"], "submitter": ["submit"], "decider": ["decide"], "canceller": ["cancel"],
    "root": ["admin"], "operator-bot": ["read", "cancel"], "signaller": ["signal"],
}


def token_of(name: str) -> str:
    return f"agrt_{name}-secret-token-0123456789"


def sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def write_tokens(path: Path, identities: dict[str, list[str]], tokens: dict[str, str] | None = None) -> None:
    """Replace the file the way a Secret volume or an editor saving atomically does: a new inode."""
    entries = [{"name": n, "sha256": sha((tokens or {}).get(n, token_of(n))), "scopes": s}
               for n, s in identities.items()]
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"identities": entries}))
    os.replace(tmp, path)


def auth(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {DEFAULT_TOKEN if name == 'default' else token_of(name)}"}


@pytest.fixture
def tokens_file(tmp_path: Path) -> Path:
    path = tmp_path / "tokens.json"
    write_tokens(path, IDENTITIES)
    return path


@pytest.fixture
async def url(store: RunStore, toolbox: ToolBox, metrics: Metrics, tokens_file: Path) -> AsyncIterator[str]:
    settings = WorkerSettings(database_url="unused", default_model=MODEL, api_token=DEFAULT_TOKEN,
                              api_tokens_file=str(tokens_file))
    async with serving(create_app(store, toolbox, settings, metrics)) as base:
        yield base


@pytest.fixture
async def http(url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        yield client


# Every /api operation, the scope it requires and what success looks like. {id} is a queued run.
ENDPOINTS: list[tuple[str, str, dict[str, Any] | None, Scope | None, int]] = [
    ("POST", "/api/runs", {"input": "hi", "tokenBudget": 100, "timeoutSeconds": 60}, Scope.SUBMIT, 201),
    ("GET", "/api/runs", None, Scope.READ, 200),
    ("GET", "/api/runs/{id}", None, Scope.READ, 200),
    ("GET", "/api/runs/{id}/timeline", None, Scope.READ, 200),
    ("GET", "/api/runs/{id}/steps/1", None, Scope.READ, 404),  # allowed: the run has no step 1
    ("POST", "/api/runs/{id}/cancel", None, Scope.CANCEL, 202),
    ("POST", "/api/runs/{id}/messages", {"text": "hi"}, Scope.SUBMIT, 202),
    ("GET", "/api/runs/{id}/messages", None, Scope.READ, 200),
    ("GET", "/api/whoami", None, None, 200),
    ("POST", "/api/agents", {"name": "made", "system": "hi"}, Scope.SUBMIT, 201),
    ("GET", "/api/agents", None, Scope.READ, 200),
    ("GET", "/api/agents/probe", None, Scope.READ, 200),
    ("GET", "/api/agents/probe/versions", None, Scope.READ, 200),
    ("GET", "/api/agents/probe/versions/1", None, Scope.READ, 200),
    ("DELETE", "/api/agents/probe", None, Scope.SUBMIT, 204),
    ("POST", "/api/events", {"key": "probe", "payload": {"ok": True}}, Scope.SIGNAL, 200),
    ("GET", "/api/tenants", None, Scope.ADMIN, 200),
    ("GET", "/api/tenants/default", None, Scope.ADMIN, 200),
    ("PUT", "/api/tenants/default", {"maxQueued": 100}, Scope.ADMIN, 200),
]
PLATFORM_ONLY = ("/api/tenants",)
"""Paths only an identity of tenant `*` may use: `root` is an admin of tenant `default` (a 403 naming why)."""
CALLERS = [*IDENTITIES, "default"]


def allows(name: str, scope: Scope | None) -> bool:
    if scope is None or name in ("root", "default"):
        return True
    if scope is Scope.SIGNAL and "submit" in IDENTITIES[name]:  # submit implies signal
        return True
    return scope.value in IDENTITIES[name]


@pytest.mark.parametrize("caller", CALLERS)
@pytest.mark.parametrize(("method", "path", "body", "scope", "ok"), ENDPOINTS,
                         ids=[f"{m} {p}" for m, p, *_ in ENDPOINTS])
async def test_every_endpoint_by_every_scope(
    http: httpx.AsyncClient, store: RunStore, caller: str, method: str, path: str,
    body: dict[str, Any] | None, scope: Scope | None, ok: int,
) -> None:
    run, _ = await store.create(new_run())
    await store.put_agent(Agent(name="probe", version=0))
    target = path.format(id=run.id)
    r = await http.request(method, target, json=body, headers=auth(caller))
    if caller == "root" and path.startswith(PLATFORM_ONLY):
        assert r.status_code == 403 and "tenant '*'" in r.json()["error"], r.text
    elif allows(caller, scope):
        assert r.status_code == ok, r.text
    else:
        assert scope is not None
        assert r.status_code == 403, r.text
        assert r.json()["error"] == f"identity {caller!r} lacks the scope {scope.value!r} this operation requires"
        assert 'error="insufficient_scope"' in r.headers["WWW-Authenticate"]
        after = await store.get(run.id)
        assert after is not None and after.status is RunStatus.QUEUED and not after.cancel_requested
    # Without a token, and with a wrong one, nothing is said about the operation.
    for headers in ({}, {"Authorization": "Bearer agrt_not-a-token"}, {"Authorization": "Basic cmVhZGVyOng="},
                    {"Authorization": f"Bearer {token_of(caller)}x"}, {"Authorization": "Bearer"}):
        r = await http.request(method, target, json=body, headers=headers)
        assert r.status_code == 401, (headers, r.text)
        assert r.json() == {"error": "missing or wrong bearer token", "fields": []}
        assert r.headers["WWW-Authenticate"] == "Bearer"


async def test_a_read_only_token_cannot_cancel_or_submit_even_with_a_bad_body(http: httpx.AsyncClient,
                                                                              store: RunStore) -> None:
    run, _ = await store.create(new_run())
    # The scope is checked before anything is parsed: no validation detail reaches a caller without it.
    r = await http.post("/api/runs", content=b"{not json", headers=auth("reader"))
    assert r.status_code == 403 and "'submit'" in r.json()["error"]
    r = await http.post(f"/api/runs/{run.id}/cancel", headers=auth("reader"))
    assert r.status_code == 403 and "'cancel'" in r.json()["error"]
    assert r.json()["fields"] == [{"field": "scope", "problem": "cancel is required"}]
    after = await store.get(run.id)
    assert after is not None and after.status is RunStatus.QUEUED and after.cancelled_by is None


async def test_health_readiness_metrics_and_the_document_stay_open(http: httpx.AsyncClient) -> None:
    for path in ("/healthz", "/readyz", "/metrics", "/openapi.json"):
        assert (await http.get(path)).status_code == 200, path


async def test_whoami_names_the_identity_and_its_scopes(http: httpx.AsyncClient) -> None:
    assert (await http.get("/api/whoami", headers=auth("operator-bot"))).json() == {
        "name": "operator-bot", "scopes": ["read", "cancel"], "tenant": "default"}
    everything = ["read", "submit", "decide", "cancel", "signal", "admin"]
    assert (await http.get("/api/whoami", headers=auth("root"))).json() == {
        "name": "root", "scopes": everything, "tenant": "default"}
    assert (await http.get("/api/whoami", headers=auth("default"))).json() == {
        "name": "default", "scopes": everything, "tenant": "*"}


async def test_who_created_and_who_cancelled_are_recorded(http: httpx.AsyncClient, store: RunStore) -> None:
    body = {"input": "hi", "tokenBudget": 100, "timeoutSeconds": 60}
    created = await http.post("/api/runs", json=body, headers=auth("submitter"))
    run_id = uuid.UUID(created.json()["id"])
    view = (await http.get(f"/api/runs/{run_id}", headers=auth("reader"))).json()
    assert (view["createdBy"], view["cancelledBy"]) == ("submitter", None)
    items = (await http.get("/api/runs", headers=auth("reader"))).json()["items"]
    assert [(i["id"], i["createdBy"]) for i in items] == [(str(run_id), "submitter")]

    cancelled = await http.post(f"/api/runs/{run_id}/cancel", headers=auth("canceller"))
    assert cancelled.status_code == 202
    assert (cancelled.json()["createdBy"], cancelled.json()["cancelledBy"]) == ("submitter", "canceller")

    # A running run keeps the first to ask: a second request changes nothing.
    claimed, _ = await store.create(new_run())
    claim = await store.claim("worker-A", 30.0)
    assert claim is not None and claim.run.id == claimed.id
    for caller in ("operator-bot", "root"):
        r = await http.post(f"/api/runs/{claimed.id}/cancel", headers=auth(caller))
        assert r.status_code == 202 and r.json()["status"] == "RUNNING"
        assert r.json()["cancelledBy"] == "operator-bot"
    # Another identity reusing an idempotency key is not a retry: it is refused, not handed the run.
    keyed = {"Idempotency-Key": "nightly-report"}
    first = await http.post("/api/runs", json=body, headers=auth("submitter") | keyed)
    retried = await http.post("/api/runs", json=body, headers=auth("submitter") | keyed)
    assert first.status_code == retried.status_code == 201 and first.json()["id"] == retried.json()["id"]
    other = await http.post("/api/runs", json=body, headers=auth("root") | keyed)
    assert other.status_code == 422 and str(first.json()["id"]) not in other.text
    # AGENTRUN_API_TOKEN is the identity `default`.
    again = await http.post("/api/runs", json=body, headers=auth("default"))
    stored = await store.get(uuid.UUID(again.json()["id"]))
    assert stored is not None and stored.created_by == "default"


async def test_a_token_removed_from_the_file_stops_working_and_a_new_one_starts(
    http: httpx.AsyncClient, tokens_file: Path
) -> None:
    assert (await http.get("/api/runs", headers=auth("reader"))).status_code == 200
    rotated = {"reader": "agrt_reader-rotated-token-abcdefgh"}
    write_tokens(tokens_file, {"reader": ["read"], "root": ["admin"]}, rotated)

    async def old_refused() -> bool:
        return (await http.get("/api/runs", headers=auth("reader"))).status_code == 401

    await eventually(old_refused, timeout=15, what="the old reader token to be refused")
    new = {"Authorization": f"Bearer {rotated['reader']}"}
    assert (await http.get("/api/runs", headers=new)).status_code == 200
    assert (await http.get("/api/runs", headers=auth("canceller"))).status_code == 401  # removed
    assert (await http.get("/api/runs", headers=auth("default"))).status_code == 200  # not in the file

    # A scope taken away is gone as quickly.
    write_tokens(tokens_file, {"reader": ["submit"], "root": ["admin"]}, rotated)

    async def read_forbidden() -> bool:
        return (await http.get("/api/runs", headers=new)).status_code == 403

    await eventually(read_forbidden, timeout=15, what="the reader's read scope to be taken away")


async def test_a_broken_file_admits_no_one_from_it_until_fixed(
    http: httpx.AsyncClient, tokens_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert (await http.get("/api/runs", headers=auth("root"))).status_code == 200
    tmp = tokens_file.with_suffix(".tmp")
    tmp.write_text('{"identities": [{"name": "root", "sha256": "' + token_of("root") + '", "scopes": ["admin"]}]}')
    os.replace(tmp, tokens_file)

    async def refused() -> bool:
        return (await http.get("/api/runs", headers=auth("root"))).status_code == 401

    await eventually(refused, timeout=15, what="the broken file to admit no one")
    assert (await http.get("/api/runs", headers=auth("default"))).status_code == 200
    assert any("sha256: must be the 64 hex digits" in r.getMessage() for r in caplog.records)
    assert not any(token_of("root") in r.getMessage() for r in caplog.records)  # the pasted token is not echoed

    tokens_file.unlink()
    write_tokens(tokens_file, IDENTITIES)

    async def admitted() -> bool:
        return (await http.get("/api/runs", headers=auth("root"))).status_code == 200

    await eventually(admitted, timeout=15, what="the fixed file to admit again")


async def test_an_open_server_records_no_identity(store: RunStore, toolbox: ToolBox, metrics: Metrics) -> None:
    settings = WorkerSettings(database_url="unused", default_model=MODEL)
    app = create_app(store, toolbox, settings, metrics)
    document = app.openapi()
    assert "securitySchemes" not in document.get("components", {})
    async with serving(app) as base, httpx.AsyncClient(base_url=base, timeout=30) as http:
        r = await http.post("/api/runs", json={"input": "hi", "tokenBudget": 100, "timeoutSeconds": 60})
        assert r.status_code == 201
        view = (await http.get(f"/api/runs/{r.json()['id']}")).json()
        assert view["createdBy"] is None
        assert (await http.get("/api/whoami")).json() == {"name": None, "scopes": [s.value for s in Scope],
                                                              "tenant": "*"}


async def test_openapi_documents_the_scheme_and_each_operations_scope(http: httpx.AsyncClient) -> None:
    document = (await http.get("/openapi.json")).json()
    (scheme,) = document["components"]["securitySchemes"].values()
    assert (scheme["type"], scheme["scheme"]) == ("http", "bearer") and "scope" in scheme["description"]
    for method, path, _, scope, _ in ENDPOINTS:
        template = path.replace("/steps/1", "/steps/{seq}").replace("/probe", "/{name}").replace("/versions/1",
                                                                                                "/versions/{n}")
        template = template.replace("/tenants/default", "/tenants/{name}")
        operation = document["paths"][template][method.lower()]
        assert operation["security"] == [{"HTTPBearer": [scope.value] if scope else []}], path
        assert operation["x-required-scope"] == (scope.value if scope else "none")
        assert "401" in operation["responses"]
        assert ("403" in operation["responses"]) is (scope is not None)
    for path in ("/healthz", "/readyz", "/metrics"):
        assert "security" not in document["paths"][path]["get"]


def test_the_file_is_checked_and_errors_name_the_entry(tmp_path: Path) -> None:
    path = tmp_path / "tokens.yaml"
    cases = {
        "identities: [{name: a, sha256: " + "ab" * 32 + ", scopes: [read, fly]}]": "identities[0].scopes: unknown scope 'fly'",
        "identities: [{name: a, sha256: abc, scopes: [read]}]": "identities[0].sha256: must be the 64 hex digits",
        "identities: [{name: a, sha256: " + "ab" * 32 + ", scopes: []}]": "identities[0].scopes: no scopes",
        "identities: [{name: default, sha256: " + "ab" * 32 + ", scopes: [read]}]": "'default' is used twice",
        "identities: [{name: a, sha256: " + "ab" * 32 + ", scopes: [read], token: x}]": "unknown field(s) token",
        "identities: [{name: a, sha256: " + "ab" * 32 + ", scopes: [read]}, {name: b, sha256: " + "ab" * 32
        + ", scopes: [read]}]": "identities[1].sha256: the same token is given to two identities",
        "just: text": "must be a mapping with an `identities` list",
        "identities: [{name: 'a b', sha256: " + "ab" * 32 + ", scopes: [read]}]": "identities[0].name: must be",
        "{": "not YAML or JSON",
    }
    for text, message in cases.items():
        path.write_text(text)
        with pytest.raises(IdentityFileError) as e:
            Identities(DEFAULT_TOKEN, str(path))
        assert message in str(e.value) and str(path) in str(e.value), (text, str(e.value))
    with pytest.raises(IdentityFileError, match="cannot read the tokens file"):
        Identities(None, str(tmp_path / "missing.yaml"))


def test_yaml_and_new_tokens_round_trip(tmp_path: Path) -> None:
    made = new_token("alice", frozenset({Scope.READ, Scope.DECIDE}))
    assert made.token.startswith("agrt_") and len(made.token) > 40
    assert made.entry == {"name": "alice", "sha256": sha(made.token), "scopes": ["read", "decide"],
                          "tenant": "default"}
    path = tmp_path / "tokens.yaml"
    path.write_text(f"# rotated by hand\nidentities:\n  - {json.dumps(made.entry)}\n")
    identities = Identities(None, str(path))
    found = identities.authenticate(made.token.encode())
    assert found is not None and found.name == "alice"
    assert found.allows(Scope.DECIDE) and not found.allows(Scope.CANCEL) and not found.allows(Scope.SUBMIT)
    assert identities.authenticate(b"agrt_" + b"x" * 43) is None
    assert new_token("alice", frozenset({Scope.READ})).token != made.token
