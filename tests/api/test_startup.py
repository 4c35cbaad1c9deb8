"""`agentrun worker` started while its database is unreachable or not migrated: alive at once, not ready,
retrying quietly, and at work as soon as the database is usable, without a restart."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from agentrun.worker.store import migrate
from agentrun.worker.testing.fake_server import FakeAnthropic
from tests.support.builders import MODEL
from tests.support.ports import free_port
from tests.support.processes import worker_argv
from tests.support.waiting import eventually

REPO = Path(__file__).resolve().parents[2]
UNREACHABLE = "database unreachable"


class Gate:
    """A TCP port in front of PostgreSQL: closed, then dropping every connection, then forwarding.

    The worker is pointed at it, so a test decides when the database becomes reachable, whatever
    server the suite runs against (embedded, a container, or AGENTRUN_TEST_DATABASE_URL).
    """

    def __init__(self, upstream_url: str) -> None:
        info = conninfo_to_dict(upstream_url)
        self.upstream_host = str(info.get("host") or "/tmp")
        self.upstream_port = int(info.get("port") or 5432)
        self.port = free_port()
        self.url = make_conninfo(upstream_url, host="127.0.0.1", port=str(self.port))
        self.forwarding = False
        self.budget: int | None = None  # while forwarding: how many more connections to forward (None: all)
        self.dropped = 0
        self._server: asyncio.Server | None = None

    async def open(self, forwarding: bool) -> None:
        self.forwarding = forwarding
        if self._server is None:
            self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    async def _upstream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.upstream_host.startswith("/"):
            return await asyncio.open_unix_connection(f"{self.upstream_host}/.s.PGSQL.{self.upstream_port}")
        return await asyncio.open_connection(self.upstream_host, self.upstream_port)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self.forwarding or self.budget == 0:
            self.dropped += 1
            writer.close()
            return
        if self.budget is not None:
            self.budget -= 1
        up_reader, up_writer = await self._upstream()

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))


class WorkerProcess:
    def __init__(self, url: str, log: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                worker_argv(self.port, "--poll-interval", "0.2", *args),
                # Retries at most half a second apart: each step below waits on the worker noticing a change.
                env={**os.environ, "AGENTRUN_DATABASE_URL": url, "AGENTRUN_LOG_LEVEL": "INFO",
                     "AGENTRUN_DATABASE_RETRY_MAX_SECONDS": "0.5", **(env or {})},
                stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
            )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    async def get(self, path: str) -> httpx.Response | None:
        """The answer, or None while nothing listens; fails at once if the process has exited."""
        assert self.proc.poll() is None, f"the worker exited with {self.proc.returncode}:\n{self.output()}"
        try:
            async with httpx.AsyncClient(base_url=self.base, timeout=10) as c:
                return await c.get(path)
        except httpx.TransportError:
            return None

    async def until(self, path: str, status: int, what: str, timeout: float = 60) -> httpx.Response:
        answers: list[httpx.Response] = []

        async def answered() -> bool:
            r = await self.get(path)
            if r is not None and r.status_code == status:
                answers.append(r)
            return bool(answers)

        await eventually(answered, timeout, what)
        return answers[0]

    async def stopped(self) -> int:
        """`stop()` off the event loop: the gate and the model server this worker talks to run on it, and a
        worker whose shutdown still needs them (a claim in flight, a query to cancel) would wait for a
        loop blocked in `wait()`."""
        return await asyncio.to_thread(self.stop)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise


@pytest.fixture
async def start_worker(tmp_path: Path) -> AsyncIterator[Callable[..., WorkerProcess]]:
    started: list[WorkerProcess] = []

    def start(url: str, *args: str, env: dict[str, str] | None = None) -> WorkerProcess:
        w = WorkerProcess(url, tmp_path / f"worker-{len(started)}.log", *args, env=env)
        started.append(w)
        return w

    try:
        yield start
    finally:
        for w in started:
            with contextlib.suppress(Exception):
                w.stop()


@pytest.fixture
def empty_database_url(postgres_url: str) -> Any:
    """A database that exists but was never migrated."""
    name = f"agentrun_empty_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield make_conninfo(postgres_url, dbname=name)
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


async def test_worker_started_during_an_outage_is_alive_not_ready_and_works_once_the_database_answers(
    database_url: str, start_worker: Callable[..., WorkerProcess]
) -> None:
    gate = Gate(database_url)
    async with FakeAnthropic() as model:
        worker = start_worker(gate.url, "--id", "startup-w", "--concurrency", "1", "--lease-seconds", "5",
                              env={"ANTHROPIC_BASE_URL": model.base_url, "ANTHROPIC_API_KEY": "test-key",
                                   "AGENTRUN_DEFAULT_MODEL": MODEL})
        try:
            # 1. The port is closed: alive and not ready, with a short reason, from the start.
            await worker.until("/healthz", 200, "/healthz while the database is unreachable")
            ready = await worker.get("/readyz")
            assert ready is not None and ready.status_code == 503, ready
            assert ready.json()["status"] == "unavailable" and ready.json()["reason"].startswith(UNREACHABLE)
            api = await worker.get("/api/runs")
            assert api is not None and api.status_code == 503 and api.json()["error"].startswith("database unavailable")

            # 2. Something answers and hangs up, again and again: the worker keeps trying, logging the
            # state once, not once per attempt.
            await gate.open(forwarding=False)

            async def retried() -> bool:
                assert worker.proc.poll() is None, worker.output()
                return gate.dropped >= 3

            await eventually(retried, 60, "three attempts to reach the database")
            assert (await worker.until("/readyz", 503, "readyz still not ready")).json()["status"] == "unavailable"
            assert worker.output().count(UNREACHABLE) == 1, worker.output()

            # 3. The database answers: ready without a restart, and a run submitted now is executed.
            gate.forwarding = True
            ready = await worker.until("/readyz", 200, "readyz once the database answers")
            assert ready.json()["schemaVersion"] == migrate.latest_version()
            async with httpx.AsyncClient(base_url=worker.base, timeout=10) as c:
                created = await c.post("/api/runs", json={"input": "hello", "tokenBudget": 10_000,
                                                          "timeoutSeconds": 120})
                assert created.status_code == 201, created.text
                run_id = created.json()["id"]

                async def succeeded() -> bool:
                    assert worker.proc.poll() is None, worker.output()
                    return (await c.get(f"/api/runs/{run_id}")).json()["status"] == "SUCCEEDED"

                await eventually(succeeded, 60, "the run to succeed")
            assert await worker.stopped() == 0
        finally:
            await gate.close()
    out = worker.output()
    assert "database ready after waiting for it" in out and "startup-w serving on" in out, out
    assert "Traceback" not in out, out


async def test_database_lost_right_after_the_start_up_check_is_waited_for_again(
    database_url: str, start_worker: Callable[..., WorkerProcess]
) -> None:
    """The check and the pool get through, then the database goes before the worker's own session (the
    third connection) is up: the process stays, not ready, and works once the database is back."""
    gate = Gate(database_url)
    gate.budget = 2
    await gate.open(forwarding=True)
    async with FakeAnthropic() as model:
        worker = start_worker(gate.url, "--id", "startup-lost", "--concurrency", "1",
                              env={"ANTHROPIC_BASE_URL": model.base_url, "ANTHROPIC_API_KEY": "test-key",
                                   "AGENTRUN_DEFAULT_MODEL": MODEL})
        try:
            async def refused_twice() -> bool:
                assert worker.proc.poll() is None, worker.output()
                return gate.dropped >= 2

            await eventually(refused_twice, 60, "the worker to be refused after its first two connections")
            ready = await worker.until("/readyz", 503, "readyz not ready while the database is gone")
            assert ready.json()["status"] == "unavailable"
            gate.budget = None
            await worker.until("/readyz", 200, "readyz once the database is back")
            async with httpx.AsyncClient(base_url=worker.base, timeout=10) as c:
                created = await c.post("/api/runs", json={"input": "hello", "tokenBudget": 10_000,
                                                          "timeoutSeconds": 120})
                assert created.status_code == 201, created.text

                async def succeeded() -> bool:
                    assert worker.proc.poll() is None, worker.output()
                    return (await c.get(f"/api/runs/{created.json()['id']}")).json()["status"] == "SUCCEEDED"

                await eventually(succeeded, 60, "the run to succeed")
            assert await worker.stopped() == 0
        finally:
            await gate.close()
    assert "Traceback" not in worker.output(), worker.output()


async def test_api_only_process_waits_for_migrations_it_does_not_apply(
    empty_database_url: str, start_worker: Callable[..., WorkerProcess]
) -> None:
    worker = start_worker(empty_database_url, "--id", "startup-api", "--concurrency", "0", "--no-migrate")
    await worker.until("/healthz", 200, "/healthz")
    ready = await worker.until("/readyz", 503, "readyz to say not migrated")
    assert ready.json() == {"status": "unavailable",
                            "reason": "database not migrated: missing migration "
                            + ", ".join(f"{m.version:04d}" for m in migrate.available())}
    # An operator's `agentrun migrate` (a Helm hook, say) runs while the worker waits.
    await migrate.migrate(empty_database_url)
    await worker.until("/readyz", 200, "readyz once migrated")
    async with httpx.AsyncClient(base_url=worker.base, timeout=10) as c:
        created = await c.post("/api/runs", json={"input": "queued", "tokenBudget": 1000, "timeoutSeconds": 60})
        assert created.status_code == 201, created.text
        assert created.json()["status"] == "QUEUED"
    assert await worker.stopped() == 0
    out = worker.output()
    assert out.count("database not migrated") == 1 and "agentrun migrate" in out, out
    assert "Traceback" not in out, out


async def test_sigterm_while_waiting_for_the_database_exits_cleanly(
    start_worker: Callable[..., WorkerProcess]
) -> None:
    closed = f"postgresql://agentrun@127.0.0.1:{free_port()}/agentrun?connect_timeout=2"
    worker = start_worker(closed, "--id", "startup-stop", "--concurrency", "2",
                          env={"ANTHROPIC_BASE_URL": "http://127.0.0.1:9"})
    await worker.until("/healthz", 200, "/healthz")
    assert await worker.stopped() == 0
    assert "startup-stop stopped" in worker.output() and "Traceback" not in worker.output()


def test_backoff_is_jittered_and_capped() -> None:
    import random

    from agentrun.worker.store.pool import Backoff

    backoff, rng = Backoff(base=0.25, cap=5.0), random.Random(7)
    delays = [[backoff.delay(attempt, rng) for _ in range(50)] for attempt in range(40)]
    assert all(0.125 <= d <= 0.25 for d in delays[0])
    assert all(2.5 <= d <= 5.0 for row in delays[5:] for d in row)  # capped, even after many attempts
    assert len({round(d, 6) for d in delays[30]}) > 40  # jittered: a fleet does not retry in step


def test_a_bad_database_retry_setting_is_refused_at_start() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "agentrun.worker.cli", "worker", "--database-url", "postgresql://agentrun@127.0.0.1:9/x"],
        env={**os.environ, "AGENTRUN_DATABASE_RETRY_MAX_SECONDS": "0"}, capture_output=True, text=True, timeout=60,
        cwd=REPO,
    )
    assert done.returncode == 1, done
    assert done.stderr.strip() == "agentrun: AGENTRUN_DATABASE_RETRY_MAX_SECONDS must be a positive number, got '0'"
