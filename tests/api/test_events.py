"""GET /api/runs/{id}/events over real HTTP: steps, run changes, streamed model text and the end; late
joiners, Last-Event-ID resumption, another process executing the run, and one LISTEN for many streams."""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from fastapi import FastAPI

from agentrun.worker.llm.anthropic_client import AnthropicClient
from agentrun.worker.obs.metrics import Metrics
from agentrun.worker.settings import WorkerSettings
from agentrun.worker.store import RunStore
from agentrun.worker.testing.fake_server import AgentResponder, FakeAnthropic
from agentrun.worker.tools import ToolBox
from tests.support.api import make_app
from tests.support.builders import new_run, worker
from tests.support.ports import free_port
from tests.support.processes import start_worker, stop, wait_ready
from tests.support.running import running
from tests.support.serving import serving
from tests.support.sse import Stream, assert_resumed_whole, streaming
from tests.support.waiting import eventually

ROOT = Path(__file__).resolve().parents[2]
BODY = {"input": "look x up", "tokenBudget": 50_000, "timeoutSeconds": 300}


@pytest.fixture
async def model() -> AsyncIterator[FakeAnthropic]:
    async with FakeAnthropic(AgentResponder("lookup", {"q": "x"}, chunk_delay=0.02)) as server:
        yield server


@contextlib.asynccontextmanager
async def driving(store: RunStore, toolbox: ToolBox, model: FakeAnthropic) -> AsyncIterator[None]:
    llm = AnthropicClient(api_key="test-key", base_url=model.base_url, http_timeout=30)
    try:
        async with running(worker(store, llm, toolbox, poll=0.05)):
            yield
    finally:
        await llm.aclose()


class HoldsTheAnswer(RunStore):
    """Holds the final answer's checkpoint until `release` is set (30 s at most): the run cannot end, and
    its stream cannot close, before the test has seen a streamed fragment of that answer."""

    def __init__(self, pool: Any, release: asyncio.Event) -> None:
        super().__init__(pool)
        self.release = release

    async def checkpoint_turn(self, *a: Any, **kw: Any) -> Any:
        if "Summary of lookup" in a[3].response:  # the model turn
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.release.wait(), 30)
        return await super().checkpoint_turn(*a, **kw)


def steps_by_seq(stream: Stream) -> dict[int, list[str]]:
    seen: dict[int, list[str]] = {}
    for step in stream.of("step"):
        seen.setdefault(step["seq"], []).append(step["status"])
    return seen


async def test_a_run_streams_its_steps_model_text_and_end(
    store: RunStore, toolbox: ToolBox, model: FakeAnthropic, server_url: str
) -> None:
    async with httpx.AsyncClient(base_url=server_url) as http:
        run_id = (await http.post("/api/runs", json=BODY)).json()["id"]
        seen_a_fragment = asyncio.Event()
        held = HoldsTheAnswer(store.pool, seen_a_fragment)
        async with streaming(http, f"/api/runs/{run_id}/events") as stream, driving(held, toolbox, model):
            await stream.until(lambda s: any(d["seq"] == 3 for d in s.of("delta")), what="a fragment of the answer")
            seen_a_fragment.set()
            await stream.until(lambda s: s.ended, what="the end")
        assert stream.status == 200
        assert all(e.id for e in stream.events), "every event has an id"
        final = stream.of("run")[-1]
        assert final["status"] == "SUCCEEDED" and final["steps"] == 3
        assert stream.events[-1].event == "end" and stream.of("end") == [{"status": "SUCCEEDED"}]
        seen = steps_by_seq(stream)
        assert set(seen) == {1, 2, 3} and all(states[-1] == "DONE" for states in seen.values())
        assert stream.of("step")[0]["kind"] == "MODEL"
        # The model's final answer, streamed in fragments as it was written. Deltas are best effort (not
        # stored; one whose notification is late may miss a stream that has ended, so the answer's checkpoint
        # was held until one arrived): what arrived is the start of the answer, in order.
        answer = "".join(d["text"] for d in stream.of("delta") if d["seq"] == 3)
        assert answer and "Summary of lookup: found x".startswith(answer)
        assert len([d for d in stream.of("delta") if d["seq"] == 3]) >= 1
        # Streaming changed nothing about the checkpoint: the step holds the whole final message.
        detail = (await http.get(f"/api/runs/{run_id}/steps/3")).json()
        assert "Summary of lookup: found x" in detail["response"]

        # A client that connects after the end gets the stored steps, the run, and the end at once.
        async with streaming(http, f"/api/runs/{run_id}/events") as late:
            await late.until(lambda s: s.closed.is_set(), what="the stream to close")
        assert sorted(s["seq"] for s in late.of("step")) == [1, 2, 3]
        assert [e.event for e in late.events][-2:] == ["run", "end"] and late.of("delta") == []


async def test_a_waiting_stream_sends_keep_alives_and_errors_are_clear(app: FastAPI, store: RunStore) -> None:
    run, _ = await store.create(new_run())
    app.state.events.keepalive = 0.3
    async with serving(app) as url, httpx.AsyncClient(base_url=url) as http:
        async with streaming(http, f"/api/runs/{run.id}/events") as stream:
            await stream.until(lambda s: s.comments >= 2, what="two keep-alive comments")
            assert [e.event for e in stream.events] == ["run"] and stream.of("run")[0]["status"] == "QUEUED"
            assert (await http.post(f"/api/runs/{run.id}/cancel")).status_code == 202
            await stream.until(lambda s: s.ended, what="the end")
        assert stream.of("run")[-1]["status"] == "CANCELLED" and stream.of("end") == [{"status": "CANCELLED"}]

        r = await http.get(f"/api/runs/{uuid.uuid4()}/events")
        assert r.status_code == 404 and "no run with id" in r.json()["error"]
        # An id the stream never sent (a proxy's, an older server's): served as a new client, not refused.
        async with streaming(http, f"/api/runs/{run.id}/events", last_event_id="yesterday") as again:
            await again.until(lambda s: s.ended, what="the end")
        assert [e.event for e in again.events] == ["run", "end"]
        r = await http.get("/api/runs/not-a-uuid/events")
        assert r.status_code == 422


async def test_the_events_need_the_token_when_the_api_has_one(store: RunStore, toolbox: ToolBox) -> None:
    run, _ = await store.create(new_run())
    app = make_app(store, toolbox, WorkerSettings(database_url="unused", api_token="s3cret"), Metrics())
    async with serving(app) as url, httpx.AsyncClient(base_url=url) as http:
        r = await http.get(f"/api/runs/{run.id}/events")
        assert r.status_code == 401 and "Traceback" not in r.text
        await store.cancel(run.id)
        async with streaming(http, f"/api/runs/{run.id}/events", headers={"Authorization": "Bearer s3cret"}) as s:
            await s.until(lambda s: s.ended, what="the end")


@contextlib.asynccontextmanager
async def worker_process(database_url: str, model_url: str) -> AsyncIterator[str]:
    """`agentrun worker` in a process of its own, executing runs and serving its own API; yields its URL."""
    port = free_port()
    env = {**os.environ, "AGENTRUN_DATABASE_URL": database_url, "ANTHROPIC_BASE_URL": model_url,
           "ANTHROPIC_API_KEY": "test-key", "AGENTRUN_TOOLS": "tests.support.event_tools",
           "PYTHONPATH": str(ROOT), "AGENTRUN_LOG_LEVEL": "WARNING"}
    proc = await start_worker(port, "--id", "worker-P", "--concurrency", "2", "--poll-interval", "0.1", "--no-migrate",
                              env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        await wait_ready(url, proc, timeout=60, what="the worker process to be ready")
        yield url
    finally:
        await stop(proc)


async def test_a_run_executing_in_another_process_streams_here_and_a_reconnect_resumes(
    database_url: str, server_url: str, model: FakeAnthropic
) -> None:
    async with worker_process(database_url, model.base_url) as other, httpx.AsyncClient() as http:
        run_id = (await http.post(f"{other}/api/runs", json=BODY)).json()["id"]
        path = f"{server_url}/api/runs/{run_id}/events"
        # First connection: until the tool call is seen running, then the client goes away.
        async with streaming(http, path) as first:
            await first.until(lambda s: any(st["kind"] == "TOOL" for st in s.of("step")), what="the tool step")
        resume_from = first.events[-1].id
        # Second connection, with the last id the first one saw: the rest, nothing twice.
        async with streaming(http, path, last_event_id=resume_from) as second:
            await second.until(lambda s: s.ended, what="the end")
        # And a client that watched all along (connected after the fact: the stored steps, then the end).
        async with streaming(http, path) as whole:
            await whole.until(lambda s: s.ended, what="the end")

    # No duplicate, and no gap: every step's last state seen across the two connections is its final state.
    both, final = assert_resumed_whole(first, second, whole)
    assert second.events and all(e.id != resume_from for e in second.events if e.event in ("step", "run"))
    assert sorted(final) == [1, 2, 3]
    assert final[2]["worker"] == "worker-P" and final[2]["toolName"] == "lookup"
    assert [Stream.decode(e) for e in both if e.event == "run"][-1] == whole.of("run")[-1]
    assert whole.of("run")[-1]["status"] == "SUCCEEDED"
    # The tool took half a second: its STARTED state was seen live before DONE.
    assert [Stream.decode(e)["status"] for e in both if e.event == "step" and Stream.decode(e)["seq"] == 2] \
        == ["STARTED", "DONE"]


async def test_two_hundred_streams_share_one_listening_connection(
    app: FastAPI, store: RunStore, database_url: str
) -> None:
    run, _ = await store.create(new_run())
    limits = httpx.Limits(max_connections=250, max_keepalive_connections=0)
    async with serving(app) as url, httpx.AsyncClient(base_url=url, limits=limits) as http:
        streams = [Stream(http, f"/api/runs/{run.id}/events").start() for _ in range(200)]
        try:
            await asyncio.gather(*(s.until(lambda s: bool(s.of("run")), what="the run") for s in streams))
            async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
                cur = await conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'LISTEN agentrun_%%'")
                row = await cur.fetchone()
                assert row is not None and row[0] == 1
                cur = await conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")
                row = await cur.fetchone()
                # At most the pool (20), the listener and this connection: not one per stream.
                assert row is not None and row[0] <= store.pool.max_size + 2
            assert (await http.post(f"/api/runs/{run.id}/cancel")).status_code == 202
            await asyncio.gather(*(s.until(lambda s: s.ended, what="the end") for s in streams))
        finally:
            await asyncio.gather(*(s.close() for s in streams))
    assert all(s.of("end") == [{"status": "CANCELLED"}] for s in streams)


async def test_a_decision_streams_as_the_calls_row_and_the_runs_pending_count(
    store: RunStore, toolbox: ToolBox, model: FakeAnthropic, server_url: str
) -> None:
    async with httpx.AsyncClient(base_url=server_url) as http:
        run_id = (await http.post("/api/runs", json={**BODY, "requireApproval": ["lookup"]})).json()["id"]
        async with streaming(http, f"/api/runs/{run_id}/events") as stream, driving(store, toolbox, model):
            await stream.until(lambda s: any(r["status"] == "WAITING" for r in s.of("run")), what="WAITING")
            waiting = [st for st in stream.of("step") if st["seq"] is None]
            assert waiting and waiting[-1]["status"] == "WAITING" and waiting[-1]["toolName"] == "lookup"
            assert [r for r in stream.of("run") if r["status"] == "WAITING"][-1]["pending"] == 1
            use = waiting[-1]["toolUseId"]
            r = await http.post(f"/api/runs/{run_id}/pending/{use}", json={"decision": "approve", "reason": "fine"})
            assert r.status_code == 200, r.text
            await stream.until(lambda s: s.ended, what="the end")
        tool = [st for st in stream.of("step") if st["seq"] == 2][-1]
        assert tool["status"] == "DONE" and [d["decision"] for d in tool["decisions"]] == ["approve"]
        assert stream.of("run")[-1]["status"] == "SUCCEEDED" and stream.of("run")[-1]["pending"] == 0
        ids = [e.id for e in stream.events if e.event in ("step", "run")]
        assert len(ids) == len(set(ids))


async def test_stopping_the_worker_ends_open_streams_instead_of_waiting_for_them(app: FastAPI, store: RunStore) -> None:
    from agentrun.worker.api.server import HttpServer

    run, _ = await store.create(new_run())  # queued, with no worker: its stream would stay open for good
    port = free_port()
    server = HttpServer(app, "127.0.0.1", port)
    serve = asyncio.create_task(server.serve())
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
        async def up() -> bool:
            with contextlib.suppress(httpx.TransportError):
                return (await http.get("/healthz")).status_code == 200
            return False

        await eventually(up, timeout=30, what="the server")
        async with streaming(http, f"/api/runs/{run.id}/events") as stream:
            await stream.until(lambda s: bool(s.of("run")), what="the run")
            server.should_exit = True
            async with asyncio.timeout(30):
                await serve
            await stream.until(lambda s: s.closed.is_set(), what="the stream to close")
    assert not stream.ended  # closed by the server going away, not by the run ending: the client reconnects


async def test_runs_watch_prints_the_steps_and_the_model_text_as_it_streams(
    app: FastAPI, store: RunStore, toolbox: ToolBox, model: FakeAnthropic, server_url: str,
    capsys: pytest.CaptureFixture[str], restore_logging: None,  # after server_url: the CLI's log handler is gone before the server stops
) -> None:
    from agentrun.worker import cli

    async with httpx.AsyncClient(base_url=server_url) as http:
        run_id = (await http.post("/api/runs", json=BODY)).json()["id"]
    watching = asyncio.create_task(asyncio.to_thread(cli.main, ["runs", "watch", run_id, "--url", server_url]))
    # The watcher subscribes before the run is driven, so it hears every fragment of the answer.
    async def subscribed() -> bool:
        return uuid.UUID(run_id) in app.state.events.subscribers

    await eventually(subscribed, timeout=30, what="the watcher to subscribe")
    async with driving(store, toolbox, model):
        code = await asyncio.wait_for(watching, 60)
    out = capsys.readouterr().out
    assert code == 0, out
    lines = out.splitlines()
    assert "  model (seq 3): Summary of lookup: found x" in lines
    rows = [line.split()[:4] for line in lines if line.strip().startswith(("1 ", "2 ", "3 "))]
    assert rows[0] == ["1", "MODEL", "-", "DONE"] and rows[-1] == ["3", "MODEL", "-", "DONE"]
    assert ["2", "TOOL", "lookup", "DONE"] in rows  # seen STARTED first too, when the stream caught it running
    assert any(line.startswith(f"run {run_id} SUCCEEDED") for line in lines)
