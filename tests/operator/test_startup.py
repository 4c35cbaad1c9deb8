"""The operator starts without its database: healthy at once, not ready until the database is there."""

from __future__ import annotations

import asyncio
import os
import pathlib
import socket
import sys
import uuid
from collections.abc import Iterator

import httpx
import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from agentrun.worker.store import RunStore
from agentrun.worker.store.pool import open_pool
from tests.support.cluster import Cluster, operator_running, settings_for, uid_of
from tests.support.ports import free_port
from tests.support.waiting import eventually


@pytest.fixture
def missing_database(postgres_url: str) -> Iterator[tuple[str, str]]:
    """A database name nobody created yet, and the URL that will reach it once it is."""
    name = f"agentrun_late_{uuid.uuid4().hex[:12]}"
    yield name, make_conninfo(postgres_url, dbname=name)
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


async def test_starts_healthy_and_waits_for_the_database(
    cluster: Cluster, postgres_url: str, missing_database: tuple[str, str]
) -> None:
    name, url = missing_database
    port = free_port()
    settings = settings_for(url, port=port, health_host="127.0.0.1", db_retry_max_seconds=0.5)
    async with operator_running(cluster, settings, wait_ready=False), httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{port}", timeout=5
    ) as http:
        async def healthy() -> bool:
            try:
                return (await http.get("/healthz")).status_code == 200
            except httpx.TransportError:
                return False

        await eventually(healthy, 15, "/healthz to answer 200 without a database")
        r = await http.get("/readyz")
        assert r.status_code == 503 and "database" in r.json()["reason"], r.text

        # An AgentRun made meanwhile waits, saying why; nothing is lost.
        obj = await cluster.create("early", input="go")
        await cluster.create_agent("early-agent", system="Waits for its database.")
        status = await cluster.wait_status("early", "Pending", lambda s: s.get("phase") == "Pending")
        assert "waiting for the database" in status["message"]
        assert [e["reason"] for e in cluster.events("early")] == ["Pending"]
        assert (await http.get("/readyz")).status_code == 503  # still: retrying, not exited

        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))

        async def ready() -> bool:
            return (await http.get("/readyz")).status_code == 200

        await eventually(ready, 30, "/readyz to answer 200 once the database is there (and migrated)")
        await cluster.wait_status("early", "Queued", lambda s: s.get("phase") == "Queued", timeout=30)
        await cluster.wait_agent("early-agent", "version 1", lambda s: s.get("version") == 1, timeout=30)
        pool = await open_pool(url, max_size=2)
        try:
            assert await RunStore(pool).get(uid_of(obj)) is not None
        finally:
            await pool.close()
        assert [e["reason"] for e in cluster.events("early")] == ["Pending", "Queued"]


async def test_the_agentrun_operator_command_waits_out_an_unreachable_database(
    cluster: Cluster, tmp_path: pathlib.Path
) -> None:
    """The real command, as a pod runs it: healthy at once, not ready, still running while it retries."""
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))  # bound, never listening: every connection is refused
    db_port = dead.getsockname()[1]
    port = free_port()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: e, cluster: {{server: "{cluster.url}"}}}}]
users: [{{name: u, user: {{}}}}]
contexts: [{{name: e, context: {{cluster: e, user: u}}}}]
current-context: e
""")
    env = {**os.environ, "KUBECONFIG": str(kubeconfig),
           "AGENTRUN_DATABASE_URL": f"postgresql://nobody@127.0.0.1:{db_port}/agentrun?connect_timeout=2"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agentrun.worker.cli", "operator", "--port", str(port),
        env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:
            async def healthy() -> bool:
                if proc.returncode is not None:
                    raise AssertionError(f"the operator exited ({proc.returncode})")
                try:
                    return (await http.get("/healthz")).status_code == 200
                except httpx.TransportError:
                    return False

            await eventually(healthy, 60, "`agentrun operator` to answer /healthz without a database")
            failures = 0

            async def retried_a_few_times() -> bool:  # a few 503s in a row, the process alive throughout
                nonlocal failures
                r = await http.get("/readyz")
                assert r.status_code == 503 and "database" in r.json()["reason"], r.text
                assert proc.returncode is None, "the operator exited"
                failures += 1
                return failures >= 5

            await eventually(retried_a_few_times, 60, "five not-ready answers")
    finally:
        dead.close()
        if proc.returncode is None:
            proc.terminate()
            await asyncio.wait_for(proc.wait(), 30)
