"""B16 (issue 48 §4, "B12" there): live streams at fan-out, `GET /api/runs/{id}/events` from many clients.

Three processes on one PostgreSQL: the API (the worker's app in uvicorn, as the tests serve it), a worker
driving `--runs` runs of many tool turns at `--model-latency` s per model call, and this one, the client:
`--streams` concurrent SSE streams over raw asyncio sockets, spread evenly over the runs.

- Delay: for each `step` and `run` event that reaches a stream while it is measured, its arrival
  (this process's `time.time()`) less its commit's time. A step's commit time is its row's `finishedAt`
  (else `startedAt`): PostgreSQL's `now()` in the transaction that wrote it, i.e. that transaction's start,
  so the delay is an upper bound (it includes the transaction's own time). A `run` event is timed by the step
  of the same transaction (same event position); a run event without one is not timed. Same machine, same
  system clock on both sides. Target: p99 ≤ 200 ms (with all the streams; also reported with one per run).
- Database load: transactions committed in the database (pg_stat_database.xact_commit, flushed by the
  server about once a second) per second and per step, with `--streams` streams, with one stream per run,
  and with none; and the API's change-feed statements per second (counted in the API process: 4 per read,
  the horizon and three queries in one round trip). Target: with `--streams` streams, the feed's
  statements/s at most 1.25 × with one per run.
- Memory per idle stream: the API process's RSS (from /proc) with no stream, then with `--streams` streams
  open on runs not yet started, divided by their number. Reported (no target).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import datetime
import json
import os
import signal
import socket
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg  # noqa: E402

from agentrun.worker.store import RunStore  # noqa: E402
from agentrun.worker.store.pool import open_pool  # noqa: E402
from bench import _pg  # noqa: E402

P99_TARGET_MS = 200.0
GROWTH_TARGET = 1.25


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def cpu_s(pid: int) -> float:
    """A process's CPU time so far (user + system), from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ---- the API process ---------------------------------------------------------------------------------


async def serve_api(url: str) -> None:
    import uvicorn

    from agentrun.worker.api.app import create_app
    from agentrun.worker.obs.metrics import Metrics
    from agentrun.worker.settings import WorkerSettings
    from agentrun.worker.tools import ToolBox

    pool = await open_pool(url, max_size=10)
    store = RunStore(pool)
    app = create_app(store, ToolBox([_pg.noop]), WorkerSettings(database_url="unused", worker_id="bench-api",
                                                                default_model=_pg.MODEL), Metrics())
    hub = app.state.events
    counts: dict[str, float] = {"reads": 0, "read_runs": 0, "read_s": 0.0}
    read = hub.feed.read

    async def counted_read(since: Any) -> Any:
        counts["reads"] += 1
        counts["read_runs"] += len(since)
        t0 = time.perf_counter()
        try:
            return await read(since)
        finally:
            counts["read_s"] += time.perf_counter() - t0

    # From a run's notification (its commit, as this process hears it) to the end of the read that found it.
    heard: dict[Any, float] = {}
    waits: list[float] = []
    dispatch = hub._dispatch

    def timed_dispatch(note: Any) -> None:
        if note.channel == "agentrun_events":
            with contextlib.suppress(ValueError):
                heard.setdefault(uuid.UUID(note.payload), time.perf_counter())
        dispatch(note)

    async def timed_read(since: Any) -> Any:
        found = await counted_read(since)
        now = time.perf_counter()
        for run_id in since:
            at = heard.pop(run_id, None)
            if at is not None:
                waits.append(1000 * (now - at))
        return found

    hub._dispatch, hub.feed.read = timed_dispatch, timed_read

    # The event loop's lag: how late a 5 ms sleep wakes, the longest in each window (work that blocks the loop).
    lags: list[float] = []

    async def probe() -> None:
        while True:
            t0 = time.perf_counter()
            await asyncio.sleep(0.005)
            lags.append(1000 * (time.perf_counter() - t0 - 0.005))

    probing = asyncio.get_running_loop().create_task(probe())

    @app.get("/bench/counters", include_in_schema=False)
    async def counters() -> dict[str, Any]:
        subscribers = sum(len(s) for s in hub.subscribers.values())
        taken = sorted(waits)
        waits.clear()
        lag = sorted(lags)
        lags.clear()
        return {**counts, "rounds": hub.rounds, "subscribers": subscribers, "notify_to_read_ms": {
                    "p50": taken[len(taken) // 2] if taken else None,
                    "p99": taken[int(0.99 * len(taken))] if taken else None},
                "loop_lag_ms": {"p99": lag[int(0.99 * len(lag))] if lag else None, "max": lag[-1] if lag else None},
                "statements": 4 * counts["reads"]}

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, access_log=False, lifespan="off",
                                           backlog=4096, timeout_keep_alive=60))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, lambda: setattr(server, "should_exit", True))
    while not server.started and not serving.done():
        await asyncio.sleep(0.01)
    print(f"ready {sock.getsockname()[1]}", flush=True)
    try:
        await serving
    finally:
        probing.cancel()
        await hub.close()
        await pool.close()


# ---- the worker process ------------------------------------------------------------------------------


async def serve_worker(url: str, runs: int, turns: int, latency: float) -> None:
    from bench.memory import SlowLlm

    pool = await open_pool(url, max_size=20)
    worker = _pg.make_worker(RunStore(pool), SlowLlm(turns, latency), [_pg.noop], concurrency=runs, pool_size=20)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, worker.stop)
    serving = asyncio.create_task(worker.run())
    print("ready", flush=True)
    try:
        await serving
    finally:
        await pool.close()


# ---- the client (this process) -----------------------------------------------------------------------


class Stream(asyncio.Protocol):
    """One SSE stream over a raw socket. While it is measured it only notes what arrived and when (the
    client's own work per event would count in the delays: 1,000 streams in one process parse in bursts);
    `parse` reads the events afterwards, each timed by the arrival of the bytes that completed it."""

    def __init__(self, run_id: str, clock: Clock) -> None:
        self.run_id, self.clock = run_id, clock
        self.first = asyncio.Event()
        self.head = b""
        self.arrived: list[tuple[float, bytes]] = []
        self.rest = b""
        self.failed: str | None = None
        self.transport: asyncio.Transport | None = None
        self.committed: dict[str, float] = {}  # event position -> commit time of its transaction's step
        self.kind, self.ident, self.data = "", "", b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.write(f"GET /api/runs/{self.run_id}/events HTTP/1.1\r\nHost: bench\r\n"
                        f"Accept: text/event-stream\r\n\r\n".encode())

    def data_received(self, data: bytes) -> None:
        if self.first.is_set():
            self.arrived.append((time.time(), data))
            return
        self.head += data
        if not self.head.startswith(b"HTTP/1.1 200 "):
            if len(self.head) >= 13:
                self.failed = f"stream of {self.run_id}: {self.head[:80]!r}"
                self.first.set()
        elif b"\nevent: run\n" in self.head:  # the first batch: kept to be parsed with the rest
            self.arrived.append((time.time(), self.head.split(b"\r\n\r\n", 1)[1]))
            self.first.set()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def parse(self) -> None:
        """Reads what arrived: chunked transfer, a size line before each chunk; SSE lines never look like
        bare hex sizes followed by nothing else, and chunks here hold whole events."""
        arrived, self.arrived = self.arrived, []
        for at, data in arrived:
            lines = (self.rest + data).split(b"\n")
            self.rest = lines.pop()
            for line in lines:
                line = line.rstrip(b"\r")
                if line.startswith(b"id: "):
                    self.ident = line[4:].decode()
                elif line.startswith(b"event: "):
                    self.kind = line[7:].decode()
                elif line.startswith(b"data: "):
                    self.data = line[6:]
                elif line == b"" and self.kind:
                    self._arrived(at)
                    self.kind, self.ident, self.data = "", "", b""
                    if len(self.committed) > 64:
                        self.committed.clear()

    def _arrived(self, now: float) -> None:
        position = self.ident.split(".")[0]
        if not self.clock.since <= now <= self.clock.until:
            return
        if self.kind == "step":
            body = json.loads(self.data)
            at = body.get("finishedAt") or body.get("startedAt")
            if at is None:
                return
            t = datetime.datetime.fromisoformat(at).timestamp()
            self.committed[position] = max(t, self.committed.get(position, 0.0))
            if t >= self.clock.since:
                self.clock.samples.append((self.run_id, t, now))
                self.clock.steps += 1
        elif self.kind == "run" and position in self.committed and self.committed[position] >= self.clock.since:
            self.clock.samples.append((self.run_id, self.committed[position], now))
            self.clock.runs += 1


class Clock:
    """The events timed: (run, its transaction's start, arrival); and when each run's commits were heard."""

    def __init__(self) -> None:
        self.since, self.until = 0.0, 0.0
        """The window measured: events that arrived in it, of transactions that began in it."""
        self.lags: list[float] = []
        self.samples: list[tuple[str, float, float]] = []
        self.heard: dict[str, list[float]] = {}
        self.steps = 0
        self.runs = 0

    async def listen(self, url: str) -> None:
        """An independent LISTEN on the events channel: PostgreSQL delivers a notification at its commit."""
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            await conn.execute("LISTEN agentrun_events")
            async for note in conn.notifies():
                self.heard.setdefault(note.payload, []).append(time.time())

    async def probe(self) -> None:
        """This process's event loop lag: how late a 5 ms sleep wakes (the delays include it)."""
        while True:
            t0 = time.perf_counter()
            await asyncio.sleep(0.005)
            self.lags.append(1000 * (time.perf_counter() - t0 - 0.005))

    def delays(self) -> tuple[list[float], list[float]]:
        """(from the transaction's start, from its commit as heard) in ms. A run's first commit heard at or
        after its transaction's start is that transaction's: a run's writes come from its one holder, in turn."""
        from_start, from_commit = [], []
        for run_id, started, arrived in self.samples:
            from_start.append(1000 * (arrived - started))
            heard = self.heard.get(run_id, [])
            i = bisect.bisect_left(heard, started)
            if i < len(heard):
                from_commit.append(1000 * (arrived - heard[i]))
        return from_start, from_commit


async def _spawn(*args: str) -> tuple[asyncio.subprocess.Process, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, __file__, *args, stdout=asyncio.subprocess.PIPE, stderr=None)
    assert proc.stdout is not None
    line = (await asyncio.wait_for(proc.stdout.readline(), 120)).decode().strip()
    if not line.startswith("ready"):
        raise RuntimeError(f"{args[:2]} did not start: {line!r}")
    return proc, line


async def _stop(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 30)
        except TimeoutError:
            proc.kill()
            await proc.wait()


async def _counters(port: int) -> dict[str, Any]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /bench/counters HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
    body = (await reader.read()).split(b"\r\n\r\n", 1)[1]
    writer.close()
    return json.loads(body)  # type: ignore[no-any-return]


async def _db(conn: Any) -> tuple[int, int]:
    """(transactions committed in this database, steps written)."""
    cur = await conn.execute("SELECT pg_stat_clear_snapshot()")
    cur = await conn.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")
    (xacts,) = await cur.fetchone()
    cur = await conn.execute("SELECT count(*) FROM run_step")
    (steps,) = await cur.fetchone()
    return int(xacts), int(steps)


async def _phase(name: str, seconds: float, port: int, conn: Any, clock: Clock | None,
                 streams: int, pids: dict[str, int]) -> dict[str, Any]:
    await asyncio.sleep(1.1)  # the server flushes its statistics about once a second
    x0, s0 = await _db(conn)
    c0 = await _counters(port)
    cpu0 = {k: cpu_s(pid) for k, pid in pids.items()}
    t0 = time.time()
    if clock is not None:
        clock.since, clock.until = t0, t0 + seconds
        clock.lags.clear()
    await asyncio.sleep(seconds)
    lags = sorted(clock.lags) if clock is not None else []
    await asyncio.sleep(1.1)
    elapsed = time.time() - t0
    x1, s1 = await _db(conn)
    c1 = await _counters(port)
    cpu = {f"{k}_cpu_percent": round(100 * (cpu_s(pid) - cpu0[k]) / elapsed, 1) for k, pid in pids.items()}
    steps = s1 - s0
    statements = c1["statements"] - c0["statements"]
    return {
        "phase": name, "streams": streams, "seconds": round(elapsed, 1), "steps": steps,
        "steps_per_s": round(steps / elapsed, 1),
        "db_transactions_per_s": round((x1 - x0 - 4) / elapsed, 1),  # less this process's 4 reads
        "db_transactions_per_step": round((x1 - x0 - 4) / max(steps, 1), 3),
        "feed_statements_per_s": round(statements / elapsed, 1),
        "feed_read_ms": round(1000 * (c1["read_s"] - c0["read_s"]) / max(1, c1["reads"] - c0["reads"]), 1),
        "feed_notify_to_read_ms": {k: v and round(v, 1) for k, v in c1["notify_to_read_ms"].items()},
        "api_loop_lag_ms": {k: v and round(v, 1) for k, v in c1["loop_lag_ms"].items()},
        "client_loop_lag_ms": {"p99": _pct(lags, 0.99), "max": round(lags[-1], 1) if lags else None},
        "feed_reads": c1["reads"] - c0["reads"], "feed_runs_read": c1["read_runs"] - c0["read_runs"], **cpu,
    }


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * len(values)))], 1)


async def bench(url: str, runs: int, streams: int, latency: float, seconds: float) -> dict[str, Any]:
    pool = await open_pool(url, max_size=4)
    store = RunStore(pool)
    turns = int((4 * seconds + 30) / latency) + 10  # the runs outlast the three phases
    ids: list[str] = []
    for start in range(0, runs, 20):
        made = await asyncio.gather(*(store.create(_pg.new_run()) for _ in range(min(20, runs - start))))
        ids += [str(run.id) for run, _ in made]
    api, ready = await _spawn("--part", "api", "--database-url", url)
    port = int(ready.split()[1])
    worker: asyncio.subprocess.Process | None = None
    clock = Clock()
    listening = asyncio.create_task(clock.listen(url))
    probing = asyncio.create_task(clock.probe())
    loop = asyncio.get_running_loop()
    opened: list[Stream] = []

    async def open_stream(run_id: str) -> Stream:
        stream = Stream(run_id, clock)
        await loop.create_connection(lambda: stream, "127.0.0.1", port)
        return stream

    try:
        # Warm: one stream opened and closed, so the feed's tasks and connections exist before the baseline.
        warm = await open_stream(ids[0])
        await asyncio.wait_for(warm.first.wait(), 60)
        warm.close()
        await asyncio.sleep(0.5)
        rss0 = rss_kb(api.pid)
        for start in range(0, streams, 50):
            batch = range(start, min(streams, start + 50))
            opened += await asyncio.gather(*(open_stream(ids[i % runs]) for i in batch))
            await asyncio.sleep(0.01)
        t_open = time.perf_counter()
        await asyncio.wait_for(asyncio.gather(*(s.first.wait() for s in opened)), 120)
        open_s = time.perf_counter() - t_open
        await asyncio.sleep(0.5)
        rss1 = rss_kb(api.pid)
        subscribers = (await _counters(port))["subscribers"]
        worker, _ = await _spawn("--part", "worker", "--database-url", url, "--runs", str(runs),
                                 "--turns", str(turns), "--model-latency", str(latency))
        pids = {"api": api.pid, "worker": worker.pid, "client": os.getpid()}
        async with pool.connection() as conn:
            await conn.set_autocommit(True)
            deadline = time.monotonic() + 60
            while (await _db(conn))[1] < 2 * runs and time.monotonic() < deadline:  # every run under way
                await asyncio.sleep(0.2)
            phases = [await _phase("all streams", seconds, port, conn, clock, streams, pids)]
            for s in opened:
                s.parse()
            measured = clock.delays(), clock.steps, clock.runs
            clock.samples, clock.steps, clock.runs = [], 0, 0
            for s in opened[runs:]:
                s.close()
            phases.append(await _phase("one stream per run", seconds, port, conn, clock, min(runs, streams), pids))
            for s in opened[:runs]:
                s.parse()
            one_per_run = clock.delays()[1]
            for s in opened[:runs]:
                s.close()
            phases.append(await _phase("no stream", seconds, port, conn, None, 0, pids))
        failed = [s for s in opened if s.failed is not None]
    finally:
        for s in opened:
            s.close()
        probing.cancel()
        if worker is not None:
            await _stop(worker)
        await _stop(api)
        listening.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listening
        await pool.close()
    full, per_run, _ = phases
    growth = (full["feed_statements_per_s"] / per_run["feed_statements_per_s"]
              if per_run["feed_statements_per_s"] else None)
    (from_start, from_commit), steps_timed, runs_timed = measured
    p99 = _pct(from_commit, 0.99)
    met = {
        "p99": p99 is not None and p99 <= P99_TARGET_MS,
        "db_load_flat": growth is not None and growth <= GROWTH_TARGET,
    }
    return {
        "runs": runs, "streams": streams, "model_latency_s": latency, "turns": turns,
        "streams_open_s": round(open_s, 2), "subscribers": subscribers,
        "events_timed": len(from_commit), "step_events_timed": steps_timed, "run_events_timed": runs_timed,
        "delay_ms": {"p50": _pct(from_commit, 0.5), "p90": _pct(from_commit, 0.9), "p99": p99,
                     "max": round(max(from_commit), 1) if from_commit else None},
        "delay_one_stream_per_run_ms": {"p50": _pct(one_per_run, 0.5), "p99": _pct(one_per_run, 0.99)},
        "delay_from_transaction_start_ms": {"p50": _pct(from_start, 0.5), "p90": _pct(from_start, 0.9),
                                            "p99": _pct(from_start, 0.99)},
        "phases": phases, "feed_growth": round(growth, 2) if growth is not None else None,
        "api_rss_no_stream_mb": round(rss0 / 1024, 1), "api_rss_idle_streams_mb": round(rss1 / 1024, 1),
        "kb_per_idle_stream": round((rss1 - rss0) / streams, 1),
        "streams_failed": len(failed), "met": met,
    }


def report(f: dict[str, Any]) -> None:
    d = f["delay_ms"]
    print(f"B16 live streams: {f['streams']} SSE streams on {f['runs']} runs, model latency {f['model_latency_s']:g} s")
    print(f"  {f['streams']} streams open in {f['streams_open_s']} s; API RSS {f['api_rss_no_stream_mb']} MB with "
          f"no stream, {f['api_rss_idle_streams_mb']} MB with {f['streams']} idle: {f['kb_per_idle_stream']} KB "
          f"per idle stream")
    print(f"  commit → stream delay over {f['events_timed']} events ({f['step_events_timed']} step, "
          f"{f['run_events_timed']} run): p50 {d['p50']} ms, p90 {d['p90']} ms, p99 {d['p99']} ms, max {d['max']} ms "
          f"(target p99 ≤ {P99_TARGET_MS:g}): {'met' if f['met']['p99'] else 'MISSED'}")
    t = f["delay_from_transaction_start_ms"]
    print(f"  (from the start of the transaction that wrote it, an upper bound: p50 {t['p50']} ms, p90 {t['p90']} ms, "
          f"p99 {t['p99']} ms; from the commit with one stream per run: {f['delay_one_stream_per_run_ms']})")
    for p in f["phases"]:
        print(f"  {p['phase']} ({p['streams']}): {p['steps_per_s']} steps/s, database {p['db_transactions_per_s']} "
              f"transactions/s ({p['db_transactions_per_step']} per step), change feed {p['feed_statements_per_s']} "
              f"statements/s ({p['feed_reads']} reads of {p['feed_runs_read']} runs, {p['feed_read_ms']} ms "
              f"each, with the horizon; notification to read {p['feed_notify_to_read_ms']}; "
              f"API loop lag {p['api_loop_lag_ms']}, this client's {p['client_loop_lag_ms']}); "
              f"CPU: API {p['api_cpu_percent']} %, worker {p['worker_cpu_percent']} %, "
              f"this client {p['client_cpu_percent']} %")
    print(f"  feed statements/s with {f['streams']} streams / with one per run: {f['feed_growth']} "
          f"(target ≤ {GROWTH_TARGET}): {'met' if f['met']['db_load_flat'] else 'MISSED'}; "
          f"streams failed: {f['streams_failed']}")


def main() -> None:
    p = _pg.parser(__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--streams", type=int, default=1000)
    p.add_argument("--model-latency", type=float, default=1.0)
    p.add_argument("--seconds", type=float, default=20.0, help="length of each measured phase")
    p.add_argument("--part", choices=["api", "worker"], help=argparse_suppress())
    p.add_argument("--turns", type=int, default=100, help=argparse_suppress())
    args = p.parse_args()
    if args.part == "api":
        asyncio.run(serve_api(args.database_url))
        return
    if args.part == "worker":
        asyncio.run(serve_worker(args.database_url, args.runs, args.turns, args.model_latency))
        return
    with _pg.database(args.database_url) as url:
        env = _pg.describe(url)
        figures = asyncio.run(bench(url, args.runs, args.streams, args.model_latency, args.seconds))
    report(figures)
    _pg.emit({**figures, **env})


def argparse_suppress() -> str:
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
