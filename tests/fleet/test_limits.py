"""Fleet-wide model limits, over real PostgreSQL and three worker processes against one local Messages
API server: at most N requests in flight across the fleet, tokens per minute held, a 429 slows every
worker; and in-process: the limits file is checked, a wait keeps the run, a cancel interrupts it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web
from psycopg_pool import AsyncConnectionPool

from agentrun.worker.core.records import RunStatus
from agentrun.worker.core.types import LlmRequest, LlmResponse, Usage
from agentrun.worker.llm.limits import Limited, Limiter, ModelLimits, estimate_tokens
from agentrun.worker.store import RunStore
from agentrun.worker.store.limits import LimitCounters
from agentrun.worker.testing.fake_server import FakeAnthropic, Json, Reply
from tests.support.builders import MODEL, new_run, worker
from tests.support.ports import free_port
from tests.support.processes import start_worker, stop, wait_ready
from tests.support.waiting import eventually

MAX_TOKENS = 100


class CountingServer(FakeAnthropic):
    """The fake Messages API, noting when each request arrived, how it was answered, and how many were
    in flight at once."""

    def __init__(self, responder: Any) -> None:
        super().__init__(responder)
        self.in_flight = 0
        self.most_in_flight = 0
        self.arrivals: list[tuple[float, int, int]] = []  # (monotonic time, status, tokens billed)

    async def answer(self, request: web.Request) -> web.StreamResponse:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        t = time.monotonic()
        try:
            response = await super().answer(request)
        finally:
            self.in_flight -= 1
        tokens = 0
        if response.status == 200:
            # What honest_usage bills, from the request: the answer may be a stream of events.
            body = await request.json()
            tokens = len(json.dumps(body["messages"])) // 4 + body["max_tokens"]
        self.arrivals.append((t, response.status, tokens))
        return response


def honest_usage(delay: float = 0.0) -> Any:
    """Answers at once (or after `delay`), billing the request's messages at four characters a token and
    its whole max_tokens: never more than the limiter's estimate, as with real text."""

    def respond(body: Json) -> Reply:
        tokens_in = len(json.dumps(body["messages"])) // 4
        return Reply.text("done", usage={"input_tokens": tokens_in, "output_tokens": body["max_tokens"]}).after(delay)

    return respond


@contextlib.asynccontextmanager
async def fleet(database_url: str, base_url: str, limits: dict[str, Any], tmp_path: Path, n: int = 3,
                concurrency: int = 4) -> AsyncIterator[list[int]]:
    """`n` worker processes sharing the limits; yields their HTTP ports once all are ready."""
    limits_file = tmp_path / "limits.yaml"
    limits_file.write_text("\n".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in limits.items()) + "\n")
    env = {**os.environ, "AGENTRUN_DATABASE_URL": database_url, "ANTHROPIC_BASE_URL": base_url,
           "AGENTRUN_MODEL_LIMITS": str(limits_file), "AGENTRUN_LLM_BACKOFF_BASE_SECONDS": "0.1"}
    ports = [free_port() for _ in range(n)]
    procs = []
    for i, port in enumerate(ports):
        log = (tmp_path / f"worker-{i}.log").open("w")
        procs.append(await start_worker(
            port, "--id", f"fleet-{i}", "--concurrency", str(concurrency), "--poll-interval", "0.2",
            "--max-tokens", str(MAX_TOKENS), "--no-migrate",
            # Nothing here checks a drain: runs still waiting on a limit are handed back at once on stop.
            "--shutdown-grace", "1", env=env, stdout=log, stderr=log,
        ))
    try:
        for i, (port, proc) in enumerate(zip(ports, procs, strict=True)):
            await wait_ready(f"http://127.0.0.1:{port}", proc, timeout=60, what="a worker to be ready",
                             output=(tmp_path / f"worker-{i}.log").read_text)
        yield ports
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.terminate()
        for proc in procs:
            await stop(proc)


async def _all_done(store: RunStore, ids: list[uuid.UUID]) -> bool:
    runs = await store.get_many(ids)
    return all(r.status.terminal for r in runs)


async def test_three_workers_never_exceed_max_concurrent_requests(store: RunStore, database_url: str,
                                                                  tmp_path: Path) -> None:
    async with CountingServer(honest_usage(delay=0.3)) as server:
        ids = [(await store.create(new_run(f"run {i}")))[0].id for i in range(18)]
        async with fleet(database_url, server.base_url, {"claude-*": {"maxConcurrentRequests": 2}}, tmp_path) as ports:
            await eventually(lambda: _all_done(store, ids), timeout=120, what="every run to end")
            metrics = [await _metrics(p) for p in ports]
    runs = await store.get_many(ids)
    assert {r.status for r in runs} == {RunStatus.SUCCEEDED}, [r.error for r in runs]
    assert server.most_in_flight == 2  # the limit, reached but never passed, by 3 × 4 slots
    waited = [_sample(m, f'agentrun_model_limit_waits_total{{model="{MODEL}"}}') for m in metrics]
    assert sum(waited) > 0
    assert 'agentrun_model_limit{kind="concurrent",limit="claude-*"} 2.0' in "".join(metrics)


async def test_tokens_per_minute_hold_across_the_fleet(store: RunStore, database_url: str, tmp_path: Path) -> None:
    # 200 tokens a second, a minute's worth at first: about 20 of the 40 requests (~600 tokens each) at once,
    # then one every 3 s. Over the 5 s looked at, the refill is 1000 tokens, as it was over 10 s at half the
    # rate; the bound below is as tight relative to the requests' size, in half the time.
    tpm = 12000.0
    async with CountingServer(honest_usage()) as server:
        ids = [(await store.create(new_run("x" * 2000)))[0].id for _ in range(40)]
        async with fleet(database_url, server.base_url, {MODEL: {"tokensPerMinute": tpm}}, tmp_path):
            await eventually(lambda: _after_first(server, 5.0), timeout=120, what="five seconds of requests")
            window = list(server.arrivals)
    served = [(t, tokens) for t, status, tokens in window if status == 200]
    assert served
    biggest = max(tokens for _, tokens in served)
    span = served[-1][0] - served[0][0]
    used = sum(tokens for _, tokens in served)
    allowed = tpm + tpm / 60 * span + biggest  # a full bucket, its refill, and one request's size
    assert used <= allowed, f"{used} tokens in {span:.1f}s, allowed {allowed:.0f}"
    assert used >= tpm * 0.8, f"only {used} tokens in {span:.1f}s: the limit is too strict"
    assert len(served) < len(ids)  # the limit held runs back


async def test_a_burst_of_429s_slows_every_worker(store: RunStore, database_url: str, tmp_path: Path) -> None:
    async with CountingServer(honest_usage()) as server:
        server.script(Reply.rate_limited(retry_after=3), Reply.rate_limited(retry_after=3))
        async with fleet(database_url, server.base_url, {"claude-*": {"requestsPerMinute": 600}}, tmp_path) as ports:
            ids = [(await store.create(new_run(f"run {i}")))[0].id for i in range(15)]
            await eventually(lambda: _all_done(store, ids), timeout=120, what="every run to end")
            metrics = [await _metrics(p) for p in ports]
    first_429 = min(t for t, status, _ in server.arrivals if status == 429)
    last_429 = max(t for t, status, _ in server.arrivals if status == 429)
    quiet = [t for t, _, _ in server.arrivals if last_429 + 1.0 < t < first_429 + 2.5]
    assert quiet == [], f"{len(quiet)} requests during the pause a 429 asked for"
    after = [t for t, status, _ in server.arrivals if status == 200 and first_429 + 2.5 <= t]
    assert after, "nothing was sent after the pause"
    # Halved to 300 a minute (5 a second) from an empty bucket: 15 runs take seconds (at the 600 a minute not
    # halved, 13 after the 429s would go in 1.3 s and break the bound), not one.
    span = after[-1] - after[0]
    assert len(after) <= 5 * span + 2, f"{len(after)} requests in {span:.1f}s after the 429s"
    # The bound above holds for the fleet's requests together, whichever workers sent them; at least one
    # worker waited for the limit to keep it (how many did depends on how the runs spread, which a loaded
    # machine decides).
    assert sum(1 for m in metrics if _sample(m, f'agentrun_model_limit_waits_total{{model="{MODEL}"}}') > 0) >= 1
    runs = await store.get_many(ids)
    assert {r.status for r in runs} == {RunStatus.SUCCEEDED}  # never failed for a limit


async def _after_first(server: CountingServer, seconds: float) -> bool:
    return bool(server.arrivals) and time.monotonic() - server.arrivals[0][0] >= seconds


async def _metrics(port: int) -> str:
    async with httpx.AsyncClient() as c:
        return (await c.get(f"http://127.0.0.1:{port}/metrics")).text


def _sample(text: str, series: str) -> float:
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return 0.0


# -- in process -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("data", "problem"), [
    ([1, 2], "top level"),
    ({"m": {}}, "at least one"),
    ({"m": {"maxConcurrent": 2}}, "unknown field 'maxConcurrent'"),
    ({"m": {"maxConcurrentRequests": 1.5}}, "positive whole number"),
    ({"m": {"requestsPerMinute": -1}}, "positive number"),
    ({"m": {"tokensPerMinute": "lots"}}, "positive number"),
    ({"m": {"tokensPerMinute": True}}, "positive number"),
])
def test_bad_limits_file_names_the_problem(data: Any, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        ModelLimits.parse(data)


def test_limits_file_yaml_and_json_and_globs(tmp_path: Path) -> None:
    (tmp_path / "l.yaml").write_text('"claude-sonnet-4-6": {maxConcurrentRequests: 2}\n"claude-*": {requestsPerMinute: 50}\n')
    limits = ModelLimits.load(str(tmp_path / "l.yaml"))
    assert limits.for_model("claude-sonnet-4-6").max_concurrent == 2  # type: ignore[union-attr]
    assert limits.for_model("claude-haiku-4-5").requests_per_minute == 50  # type: ignore[union-attr]
    assert limits.for_model("gpt-5") is None
    (tmp_path / "l.json").write_text('{"m": {"tokensPerMinute": 1000}}')
    assert ModelLimits.load(str(tmp_path / "l.json")).for_model("m").tokens_per_minute == 1000  # type: ignore[union-attr]
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ValueError, match="not valid JSON"):
        ModelLimits.load(str(tmp_path / "bad.json"))


class Gate:
    """An LlmClient whose calls wait until released, counting those in flight."""

    def __init__(self) -> None:
        self.go = asyncio.Event()
        self.in_flight = 0

    async def send(self, request: LlmRequest) -> LlmResponse:
        self.in_flight += 1
        try:
            await self.go.wait()
            return LlmResponse(content=[{"type": "text", "text": "done"}], stop_reason="end_turn",
                               usage=Usage(input_tokens=1, output_tokens=1))
        finally:
            self.in_flight -= 1


class LateAnswers(LimitCounters):
    """The reservation is made on the server, and its answer is late: a cancel comes first."""

    def __init__(self, pool: AsyncConnectionPool[Any]) -> None:
        super().__init__(pool)
        self.made = asyncio.Event()

    async def reserve(self, params: Any) -> Any:
        row = await super().reserve(params)
        self.made.set()
        await asyncio.Event().wait()
        return row


async def test_a_cancel_while_the_reservation_is_answered_frees_its_slot(pool: AsyncConnectionPool[Any]) -> None:
    limiter = Limiter(ModelLimits.parse({MODEL: {"maxConcurrentRequests": 1}}), pool)
    late = LateAnswers(pool)
    limiter._store = late
    waiting = asyncio.create_task(limiter.acquire(MODEL, 10))
    await asyncio.wait_for(late.made.wait(), 20)
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT in_flight FROM model_limit WHERE key = %s", (MODEL,))
        assert len((await cur.fetchone())[0]) == 1  # type: ignore[index]  # taken on the server
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT in_flight FROM model_limit WHERE key = %s", (MODEL,))
        assert (await cur.fetchone())[0] == {}  # type: ignore[index]  # and freed, not left to expire


async def test_a_waiting_run_keeps_its_lease_and_a_cancel_interrupts_the_wait(
    store: RunStore, pool: AsyncConnectionPool[Any]
) -> None:
    gate = Gate()
    limiter = Limiter(ModelLimits.parse({MODEL: {"maxConcurrentRequests": 1}}), pool)
    w = worker(store, Limited(gate, limiter), lease=3.0, concurrency=2)
    first, _ = await store.create(new_run("first"))
    second, _ = await store.create(new_run("second"))
    serving = asyncio.create_task(w.run())
    try:
        async def both_held() -> bool:
            runs = await store.get_many([first.id, second.id])
            return all(r.status is RunStatus.RUNNING for r in runs) and gate.in_flight == 1
        await eventually(both_held, timeout=20, what="one run calling and one waiting")
        waiting = next(r for r in await store.get_many([first.id, second.id]) if r.locked_until is not None)
        held_until = waiting.locked_until
        # Longer than the lease: the heartbeat keeps both runs while one waits for the limit.
        await eventually(lambda: _renewed_past(store, [first.id, second.id], held_until), timeout=30,
                         what="the leases to be renewed")
        assert gate.in_flight == 1
        # Cancel both: the one waiting for the limit is interrupted at once, the one in the call too.
        await store.cancel(first.id)
        await store.cancel(second.id)
        await eventually(lambda: _all_done(store, [first.id, second.id]), timeout=20, what="the cancels")
        runs = await store.get_many([first.id, second.id])
        assert {r.status for r in runs} == {RunStatus.CANCELLED}
        # The slots were given back, not left to expire.
        async with pool.connection() as conn:
            cur = await conn.execute("SELECT in_flight FROM model_limit WHERE key = %s", (MODEL,))
            assert (await cur.fetchone())[0] == {}  # type: ignore[index]
    finally:
        w.stop()
        gate.go.set()
        await asyncio.wait_for(serving, 30)


async def _renewed_past(store: RunStore, ids: list[uuid.UUID], then: Any) -> bool:
    runs = await store.get_many(ids)
    return all(r.locked_until is not None and r.locked_until > then for r in runs) and all(
        r.status is RunStatus.RUNNING for r in runs)


def test_estimate_is_size_plus_max_tokens() -> None:
    request = LlmRequest(model=MODEL, max_tokens=100, messages=[{"role": "user", "content": "x" * 300}])
    assert 200 <= estimate_tokens(request) <= 220


async def test_a_pause_refills_nothing_so_the_first_requests_after_it_go_at_the_tightened_rate(
    pool: AsyncConnectionPool[Any],
) -> None:
    """A 429 empties the buckets and pauses the limit for its `retry-after`; the buckets fill again from the
    pause's end, not from the 429. (They filled during the pause, so every call waiting out a long
    `retry-after` went at once when it ended: 12 requests in 1.8 s at a tightened 5 a second.)"""
    limiter = Limiter(ModelLimits.parse({MODEL: {"requestsPerMinute": 600}}), pool)
    await limiter.acquire(MODEL, 1)  # makes the row
    async with pool.connection() as conn:  # tightened 10 s ago (5 a second), a pause that ended 0.2 s ago
        await conn.execute(
            """UPDATE model_limit SET factor = 0.5, tight_until = now() + interval '1 minute', requests = 0,
                   tokens = 0, refilled_at = now() - interval '10 seconds',
                   paused_until = now() - interval '200 milliseconds'
               WHERE key = %s""", (MODEL,))
        await conn.commit()
    taken = 0
    while taken < 10:
        async with pool.connection() as conn:
            cur = await conn.execute("SELECT requests FROM model_limit WHERE key = %s", (MODEL,))
            before = (await cur.fetchone())[0]  # type: ignore[index]
        grant = await asyncio.wait_for(limiter.acquire(MODEL, 1), 30)
        assert grant is not None
        taken += 1
        async with pool.connection() as conn:
            cur = await conn.execute(
                "SELECT requests, extract(epoch FROM now() - paused_until)::float8 FROM model_limit WHERE key = %s",
                (MODEL,))
            left, since_pause = (await cur.fetchone())  # type: ignore[misc]
        # What the bucket held is at most what 5 a second refilled since the pause ended, never 10 s worth.
        assert before <= 5 * since_pause + 1, (taken, before, since_pause)
        assert left <= 5 * since_pause, (taken, left, since_pause)
        if since_pause > 1.5:
            break
