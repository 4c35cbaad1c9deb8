"""No API key, token or password leaks: a real `agentrun worker` process, whose environment holds all three,
drives runs through a retried model error, a tool call and a failed model call, runs a tool that logs
the secrets outright (in a message and in a logged exception's traceback), and serves API calls that
carry the token (right and wrong) in their Authorization header; none of the secrets appears in run
rows, step rows, the timeline, error messages, API answers, metrics or any log line (at DEBUG), in
console or JSON log format."""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from agentrun.worker.core.records import RunStatus
from agentrun.worker.store import RunStore
from agentrun.worker.testing.fake_server import FakeAnthropic, Reply
from bench.chaos_tools import EXEC_TABLE
from tests.support.builders import new_run
from tests.support.ports import free_port
from tests.support.processes import start_worker, wait_ready

REPO = Path(__file__).resolve().parents[2]
API_KEY = "sk-ant-api03-SECRETKEY-0123456789"
API_TOKEN = "tok-SECRETTOKEN-9876543210"
DB_PASSWORD = "SECRETPASS-5555"
SECRETS = (API_KEY, API_TOKEN, DB_PASSWORD)


async def _use_the_api(url: str) -> str:
    """API calls with the token in the header, right and wrong; returns everything the API answered."""
    answers = []
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        good = {"Authorization": f"Bearer {API_TOKEN}"}
        for headers in (good, {"Authorization": f"Bearer {API_KEY}"}, {"Authorization": API_TOKEN},
                        {"Authorization": f"Bearer {API_TOKEN}{DB_PASSWORD}"}):
            for method, path, body in (("GET", "/api/runs", None), ("POST", "/api/runs", {"input": API_KEY}),
                                       ("GET", f"/api/runs/{API_TOKEN}", None)):
                r = await http.request(method, path, headers=headers, json=body)
                assert r.status_code == (401 if headers is not good else {"GET": 200, "POST": 422}[method]) or (
                    headers is good and path.endswith(API_TOKEN) and r.status_code == 422), (headers, path, r.text)
                answers.append(r.text)
        metrics = await http.get("/metrics")
        assert metrics.status_code == 200 and "agentrun_tokens_total" in metrics.text
        answers.append(metrics.text)
    return "\n".join(answers)


@pytest.fixture
def url_with_password(database_url: str, db: psycopg.AsyncConnection[Any]) -> Iterator[str]:
    """The test database's URL as a role of its own whose password is DB_PASSWORD.

    A server that asks for passwords (testcontainers, AGENTRUN_TEST_DATABASE_URL) checks it, so the
    worker really logs in with it; the embedded server trusts local connections and never asks, but
    the password is in the worker's URL either way, there to be leaked. Host, port and database stay
    the test URL's.
    """
    role = f"ar_secret_{uuid.uuid4().hex[:8]}"
    name = sql.Identifier(role)
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(name, sql.Literal(DB_PASSWORD)))
        for grant in ("GRANT ALL ON SCHEMA public TO {}", "GRANT ALL ON ALL TABLES IN SCHEMA public TO {}",
                      "GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {}",
                      # and on the tables the test makes afterwards (the chaos tools' execution log)
                      "ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT ALL ON TABLES TO {}"):
            admin.execute(sql.SQL(grant).format(name))
        admin.execute(sql.SQL("GRANT CONNECT, TEMPORARY ON DATABASE {} TO {}").format(
            sql.Identifier(conninfo_to_dict(database_url)["dbname"]), name))
    try:
        yield make_conninfo(database_url, user=role, password=DB_PASSWORD)
    finally:
        with psycopg.connect(database_url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP OWNED BY {}").format(name))  # its grants and default privileges
            admin.execute(sql.SQL("DROP ROLE {}").format(name))


@pytest.mark.parametrize("log_format", ["console", "json"])
async def test_secrets_stay_out_of_rows_timeline_errors_and_logs(
    store: RunStore, db: psycopg.AsyncConnection[Any], url_with_password: str, log_format: str
) -> None:
    await db.execute(EXEC_TABLE)
    assert conninfo_to_dict(url_with_password)["password"] == DB_PASSWORD
    async with FakeAnthropic() as api:
        api.script(
            Reply.overloaded(),  # retried: a warning with the error is logged
            Reply.tool_use("chaos_step", {"run": "1", "turn": 0, "part": 0}, id="toolu_secret_1"),
            Reply.tool_use("leaky", {}, id="toolu_secret_2"),
            Reply.text("done"),
            Reply.bad_request("messages.0: this request is refused"),  # the second run fails with it
        )
        first, _ = await store.create(new_run("run one"))
        second, _ = await store.create(new_run("run two"))
        env = {
            **os.environ,
            "ANTHROPIC_API_KEY": API_KEY,
            "ANTHROPIC_BASE_URL": api.base_url,
            "AGENTRUN_API_TOKEN": API_TOKEN,
            "AGENTRUN_DATABASE_URL": url_with_password,
            "AGENTRUN_TOOLS": "bench.chaos_tools,tests.worker.leaky_tools",
            "AGENTRUN_LOG_LEVEL": "DEBUG",
            "AGENTRUN_LOG_FORMAT": log_format,
            "AGENTRUN_LLM_BACKOFF_BASE_SECONDS": "0.01",
            "PYTHONPATH": str(REPO),
        }
        port = free_port()
        proc = await start_worker(port, "--id", "secret-worker", "--concurrency", "1", "--poll-interval", "0.1",
                                  env=env)
        try:
            # /readyz, not /healthz: a worker is alive (healthz) before it has reached its database.
            await wait_ready(f"http://127.0.0.1:{port}", proc, timeout=30, what="the worker's API to come up")
            answers = await _use_the_api(f"http://127.0.0.1:{port}")
            deadline = time.monotonic() + 60
            while True:
                runs = [await store.get(first.id), await store.get(second.id)]
                if all(r is not None and r.status.terminal for r in runs):
                    break
                assert proc.returncode is None, "the worker exited"
                assert time.monotonic() < deadline, "the runs did not finish"
                await asyncio.sleep(0.05)
        finally:
            proc.terminate()
            output, _ = await asyncio.wait_for(proc.communicate(), 30)
        bodies = repr(api.requests)

    one, two = runs
    assert one is not None and one.status is RunStatus.SUCCEEDED, one.error
    assert two is not None and two.status is RunStatus.FAILED and "refused" in (two.error or "")
    logs = output.decode(errors="replace")
    assert "model call failed" in logs and "secret-worker" in logs  # the logs were really captured
    # The leaky tool's lines were logged, traceback and all, with the secrets taken out.
    assert "leaky tool failed" in logs and "Authorization: Bearer [REDACTED]" in logs
    if log_format == "json":
        records = [json.loads(line) for line in logs.splitlines() if line.strip()]  # every line is JSON
        leaked = next(r for r in records if r["message"].startswith("leaky tool failed"))
        assert leaked["error"]["type"] == "ConnectionError" and "raise ConnectionError" in leaked["error"]["stack_trace"]
        assert leaked["error"]["message"].startswith("cannot connect to") and "[REDACTED]" in leaked["error"]["message"]
    else:
        assert "Traceback (most recent call last)" in logs and "ConnectionError: cannot connect to" in logs
    cur = await db.execute("SELECT row_to_json(r)::text FROM run r UNION ALL SELECT row_to_json(s)::text FROM run_step s")
    rows = " ".join(r[0] for r in await cur.fetchall())
    timeline = repr([await store.timeline(first.id), await store.timeline(second.id)])
    for secret in SECRETS:
        for where, text in (("rows", rows), ("timeline", timeline), ("logs", logs), ("model request bodies", bodies),
                            ("API answers and metrics", answers)):
            assert secret not in text, f"{secret[:8]}… leaked into the {where}"


FILE_TOKENS = {"reader": "agrt_READER-SECRET-1111111111", "submitter": "agrt_SUBMIT-SECRET-2222222222",
               "gone": "agrt_REMOVED-SECRET-3333333333"}


def _tokens_file(path: Path, names: list[str]) -> None:
    import hashlib

    scopes = {"reader": ["read"], "submitter": ["submit", "read"], "gone": ["admin"]}
    entries = [{"name": n, "sha256": hashlib.sha256(FILE_TOKENS[n].encode()).hexdigest(), "scopes": scopes[n]}
               for n in names]
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"identities": entries}))
    os.replace(tmp, path)


@pytest.mark.parametrize("log_format", ["console", "json"])
async def test_tokens_of_the_tokens_file_stay_out_of_logs_errors_metrics_and_rows(
    store: RunStore, database_url: str, db: psycopg.AsyncConnection[Any], tmp_path: Path, log_format: str
) -> None:
    """A real `agentrun worker` with AGENTRUN_API_TOKENS: tokens used right, wrong, without their scope,
    and after being removed from the file appear nowhere, while the identities' names are recorded."""
    tokens = tmp_path / "tokens.json"
    _tokens_file(tokens, ["reader", "submitter", "gone"])
    env = {**os.environ, "AGENTRUN_DATABASE_URL": database_url, "AGENTRUN_API_TOKENS": str(tokens),
           "AGENTRUN_LOG_LEVEL": "DEBUG", "AGENTRUN_LOG_FORMAT": log_format, "PYTHONPATH": str(REPO)}
    env.pop("AGENTRUN_API_TOKEN", None)
    port = free_port()
    proc = await start_worker(port, "--id", "token-worker", "--concurrency", "0", "--no-migrate", env=env)
    answers: list[str] = []
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
            deadline = time.monotonic() + 30
            # /readyz, not /healthz: the API answers 503 until the worker has reached its database.
            await wait_ready(f"http://127.0.0.1:{port}", proc, timeout=30, what="the worker's API to come up")

            def bearer(name: str, suffix: str = "") -> dict[str, str]:
                return {"Authorization": f"Bearer {FILE_TOKENS[name]}{suffix}"}

            body = {"input": "audited", "tokenBudget": 100, "timeoutSeconds": 60}
            calls = [(bearer("submitter"), "POST", "/api/runs", body, 201),
                     (bearer("reader"), "POST", "/api/runs", body, 403),
                     (bearer("reader"), "GET", "/api/runs", None, 200),
                     (bearer("reader", "x"), "GET", "/api/runs", None, 401),
                     ({"Authorization": FILE_TOKENS["gone"]}, "GET", "/api/runs", None, 401),
                     (bearer("gone"), "GET", "/api/whoami", None, 200)]
            for headers, method, path, payload, status in calls:
                r = await http.request(method, path, headers=headers, json=payload)
                assert r.status_code == status, (path, r.text)
                answers.append(r.text)
            _tokens_file(tokens, ["reader", "submitter"])
            while (r := await http.get("/api/whoami", headers=bearer("gone"))).status_code != 401:
                assert time.monotonic() < deadline + 30, "the removed token still works"
                await asyncio.sleep(0.05)
            answers.append(r.text)
            metrics = await http.get("/metrics")
            assert metrics.status_code == 200
            answers.append(metrics.text)
    finally:
        proc.terminate()
        output, _ = await asyncio.wait_for(proc.communicate(), 30)
    logs = output.decode(errors="replace")
    assert "token-worker" in logs and "tokens file" in logs  # the logs were really captured, the re-read too
    cur = await db.execute("SELECT row_to_json(r)::text FROM run r")
    rows = " ".join(r[0] for r in await cur.fetchall())
    assert '"created_by":"submitter"' in rows
    for secret in FILE_TOKENS.values():
        for where, text in (("logs", logs), ("API answers and metrics", "\n".join(answers)), ("rows", rows)):
            assert secret not in text, f"{secret[:10]}… leaked into the {where}"
