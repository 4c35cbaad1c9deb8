"""The crash-and-resume story, told with real processes: PostgreSQL, a model, two workers, one kill -9."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
import uuid
import warnings
from collections.abc import AsyncIterator
from typing import Any

import httpx

from agentrun.worker.core.records import StepKind, StepStatus
from agentrun.worker.demo import tickets
from agentrun.worker.store import RunStore, migrate
from agentrun.worker.store.pool import open_pool
from agentrun.worker.testing import embedded_postgres as embedded

QUESTION = "Which acme tickets are overdue?"
MODEL_LATENCY = 0.8  # seconds the local model takes to answer, so the timeline looks like real life


@dataclasses.dataclass(frozen=True)
class Options:
    keep: bool = False
    live: bool = False
    lease_seconds: float = 5.0
    tool_delay: float = 2.0
    verbose: bool = False


class Say:
    """What the demo prints: its own narration, and the workers' log lines as they arrive."""

    def __init__(self, verbose: bool) -> None:
        self.verbose = verbose
        self.t0 = time.monotonic()
        self.worker_lines: list[str] = []
        self.tty = sys.stdout.isatty()

    def style(self, text: str, code: str) -> str:
        """ANSI styling on a terminal only (1 bold, 2 dim), so piped output stays plain."""
        return f"\033[{code}m{text}\033[0m" if self.tty else text

    def step(self, text: str) -> None:
        print(f"{self.style(f'[{time.monotonic() - self.t0:5.1f}s]', '2')} {text}", flush=True)

    def worker(self, line: str) -> None:
        self.worker_lines.append(line)
        print(f"    {line}", flush=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class WorkerProcess:
    def __init__(self, name: str, port: int, env: dict[str, str], options: Options, say: Say) -> None:
        self.name, self.port, self.env, self.options, self.say = name, port, env, options, say
        self.proc: asyncio.subprocess.Process | None = None
        self._pump: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "agentrun.worker.cli", "worker", "--id", self.name, "--port", str(self.port),
            "--host", "127.0.0.1", "--concurrency", "2", "--lease-seconds", f"{self.options.lease_seconds:g}",
            "--poll-interval", "0.2", "--no-migrate",
            env=self.env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C reaches the demo, which then stops the workers itself
        )
        self._pump = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.proc and self.proc.stdout
        async for raw in self.proc.stdout:
            line = raw.decode(errors="replace").rstrip()
            if line.startswith(f"{self.name} run="):
                self.say.worker(line)
            elif self.options.verbose and line:
                print(f"    {self.say.style(line, '2')}", flush=True)

    async def ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        async with httpx.AsyncClient() as client:
            while True:
                assert self.proc
                if self.proc.returncode is not None:
                    raise RuntimeError(f"{self.name} exited with status {self.proc.returncode} while starting")
                with contextlib.suppress(httpx.TransportError):
                    if (await client.get(f"{self.url}/readyz")).status_code == 200:
                        return
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{self.name} did not become ready in {timeout:g}s")
                await asyncio.sleep(0.1)

    def kill(self) -> None:
        if self.proc and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)

    async def stop(self) -> None:
        if self.proc and self.proc.returncode is None:
            self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), 10)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        if self._pump:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._pump, 2)


@contextlib.asynccontextmanager
async def embedded_postgres(say: Say) -> AsyncIterator[str]:
    say.step("database: starting an embedded PostgreSQL 16 in a temporary directory")
    data = tempfile.mkdtemp(prefix="agentrun-demo-", dir=embedded.scratch_root())
    server = await asyncio.to_thread(embedded.start, data, what="the demo (make demo installs it)")
    embedded.skip_fsync(server)  # the demo's data is thrown away after
    try:
        yield str(server.get_uri())
    finally:
        await asyncio.to_thread(server.cleanup)
        shutil.rmtree(data, ignore_errors=True)


@contextlib.asynccontextmanager
async def local_model(options: Options, say: Say) -> AsyncIterator[tuple[str | None, Any]]:
    """The model the workers talk to: the real API with --live, else the local Messages API server."""
    if options.live:
        say.step("model: the real Anthropic API (--live)")
        yield None, None
        return
    from agentrun.worker.testing.fake_server import AgentResponder, FakeAnthropic

    agent = AgentResponder("list_tickets", {"status": "overdue"})
    server = FakeAnthropic(lambda body: agent(body).after(MODEL_LATENCY))
    await server.start()
    say.step(f"model: a local Messages API server at {server.base_url} (the real anthropic SDK talks to it)")
    try:
        yield server.base_url, server
    finally:
        await server.stop()


@contextlib.asynccontextmanager
async def run_store(db_url: str) -> AsyncIterator[RunStore]:
    """The store, for the demo to watch the run's rows as they change (reads only)."""
    pool = await open_pool(db_url, max_size=2)
    try:
        yield RunStore(pool)
    finally:
        await pool.close()


async def _held_by(store: RunStore, run_id: str, worker: str) -> bool:
    run = await store.get(uuid.UUID(run_id))
    return run is not None and run.locked_by == worker


async def _tool_started(store: RunStore, run_id: str) -> bool:
    return any(s.kind is StepKind.TOOL and s.status is StepStatus.STARTED for s in await store.steps(uuid.UUID(run_id)))


async def _finished(store: RunStore, run_id: str) -> str | None:
    """The run's status once it has finished, else None."""
    run = await store.get(uuid.UUID(run_id))
    return run.status.value if run is not None and run.finished_at is not None else None


async def _wait_for(what: str, check: Any, say: Say, timeout: float = 60) -> Any:
    say.step(what)
    deadline = time.monotonic() + timeout
    while True:
        result = await check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise RuntimeError(f"gave up after {timeout:g}s: {what}")
        await asyncio.sleep(0.05)


async def tell(options: Options) -> int:
    say = Say(options.verbose)
    if options.live and not os.environ.get("ANTHROPIC_API_KEY"):
        print("agentrun demo: --live needs ANTHROPIC_API_KEY", file=sys.stderr)
        return 2
    # Ctrl-C and SIGTERM (and SIGINT even when a shell started the demo in the background, which ignores
    # it) stop the story the same way: through the cleanup below, never leaving a process behind.
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, task.cancel)
    async with (
        embedded_postgres(say) as db_url,
        local_model(options, say) as (model_url, model),
        run_store(db_url) as store,
    ):
        await migrate.migrate(db_url)
        await tickets.create_schema(db_url)
        env = {
            **os.environ,
            "AGENTRUN_DATABASE_URL": db_url,
            "AGENTRUN_TOOLS": "agentrun.worker.demo.tickets",
            tickets.DELAY_ENV: f"{options.tool_delay:g}",
            "AGENTRUN_LOG_FORMAT": "console",
        }
        if model_url:
            env["ANTHROPIC_BASE_URL"] = model_url
            env["ANTHROPIC_API_KEY"] = "local-demo-key"  # the SDK wants one; the local server ignores it
        workers = [WorkerProcess("worker-A", _free_port(), env, options, say),
                   WorkerProcess("worker-B", _free_port(), env, options, say)]
        try:
            return await _story(options, say, store, db_url, (model_url, model), *workers)
        finally:
            # The workers stop while the database and the model they talk to still answer: stopped
            # after them, a worker spent its shutdown grace reconnecting to a database that was gone.
            for w in workers:
                await w.stop()


async def _story(options: Options, say: Say, store: RunStore, db_url: str, local: tuple[str | None, Any],
                 a: WorkerProcess, b: WorkerProcess) -> int:
    """Worker A claims the run and is killed mid-tool; worker B takes it over; what happened is told."""
    model_url, model = local
    await a.start()
    await a.ready()
    say.step(f"worker-A is up (lease {options.lease_seconds:g}s)")

    async with httpx.AsyncClient(base_url=a.url, timeout=10) as api:
        r = await api.post("/api/runs", json={"input": QUESTION, "tokenBudget": 50_000, "timeoutSeconds": 300})
        r.raise_for_status()
        run_id = r.json()["id"]
    say.step(f"POST /api/runs {QUESTION!r} → run {run_id} QUEUED")

    # Worker B starts only once A holds the run, so the story is the same every time.
    await _wait_for(
        "waiting for worker-A to claim the run…",
        lambda: _held_by(store, run_id, "worker-A"), say,
    )
    await b.start()
    await _wait_for(
        "waiting for worker-A to start the tool step…",
        lambda: _tool_started(store, run_id),
        say,
    )
    a.kill()
    say.step(f"{say.style('worker-A killed with kill -9', '1')} in the middle of the tool call")
    await b.ready()
    say.step("worker-B is up; it will take the run over from its last checkpoint")

    status = await _wait_for("waiting for the run to finish…", lambda: _finished(store, run_id), say,
                             timeout=120)
    print()
    async with httpx.AsyncClient(base_url=b.url, timeout=10) as api:
        run = (await api.get(f"/api/runs/{run_id}")).json()
        timeline = (await api.get(f"/api/runs/{run_id}/timeline")).json()
    attempts = {s.seq: s.attempts for s in await store.steps(uuid.UUID(run_id))}
    effects = await tickets.queries_recorded(db_url, run_id)
    first_calls = None
    if model is not None:
        first_calls = sum(1 for body in model.requests if len(body.get("messages", [])) == 1)
    _print_timeline(timeline, attempts)
    print()
    _explain(status, run, timeline, attempts, effects, first_calls, options)
    if run.get("output") is not None:
        answer = run["output"] if isinstance(run["output"], str) else json.dumps(run["output"])
        print()
        print(say.style("The answer (GET /api/runs/{id} → output):", "1"))
        print(_wrap(answer))
    if options.keep:
        _print_keep(a, b, db_url, model_url)
        await asyncio.Event().wait()  # until Ctrl-C
    ok = status == "SUCCEEDED" and (first_calls is None or first_calls == 1)
    return 0 if ok else 1


def _print_timeline(timeline: list[dict[str, Any]], attempts: dict[int, int]) -> None:
    print(
        f"{'seq':>3}  {'kind':<5} {'what':<24} {'status':<6} {'latency':>8} "
        f"{'in':>6} {'out':>5} {'cache r/w':>11}  worker"
    )
    for s in timeline:
        what = s.get("stopReason") or ""
        if s["kind"] == "TOOL":
            what = f"{s['toolName']} ×{attempts.get(s['seq'], 1)}"
        cache = f"{s.get('cacheReadInputTokens', 0)}/{s.get('cacheCreationInputTokens', 0)}"
        latency = f"{s['latencyMs']}ms" if s.get("latencyMs") is not None else "-"
        print(
            f"{s['seq']:>3}  {s['kind']:<5} {what:<24} {s['status']:<6} {latency:>8} {s.get('inputTokens', 0):>6} "
            f"{s.get('outputTokens', 0):>5} {cache:>11}  {s.get('worker') or '-'}"
        )


def _explain(
    status: str, run: dict[str, Any], timeline: list[dict[str, Any]], attempts: dict[int, int], effects: int,
    first_calls: int | None, options: Options,
) -> None:
    tool = next((s for s in timeline if s["kind"] == "TOOL"), None)
    first = next((s for s in timeline if s["kind"] == "MODEL"), None)
    cost = run.get("costUsd")
    cost_text = f"${cost:.4f}" if isinstance(cost, (int, float)) else "unknown"
    parts = [f"The run ended {status} with {run.get('tokensUsed')} tokens ({cost_text})."]
    if first is not None:
        calls = f" (the model server saw it {first_calls} time{'s' if first_calls != 1 else ''})" if first_calls else ""
        parts.append(
            f"Worker-A made the first model call (seq {first['seq']}) and checkpointed it before it was killed; "
            f"worker-B replayed that step from PostgreSQL instead of calling the model again{calls}, "
            "so those tokens were paid once."
        )
    if tool is not None:
        n = attempts.get(tool["seq"], 1)
        parts.append(
            f"The tool call {tool['toolName']} ({tool['toolUseId']}) was in flight when worker-A died, so its step "
            f"stayed STARTED and worker-B executed it again: {n} executions with the same idempotency key, "
            f"which the tool honours (INSERT … ON CONFLICT DO NOTHING), leaving {effects} recorded effect."
        )
    parts.append(
        "Nothing but the lease moved between the workers: the run row and its step log are the whole state."
    )
    print(_wrap(" ".join(parts)))


def _wrap(text: str, width: int = 100) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(text, width))


def _print_keep(a: WorkerProcess, b: WorkerProcess, db_url: str, model_url: str | None) -> None:
    print()
    print("--keep: the servers stay up until Ctrl-C. Try:")
    print(f"  export AGENTRUN_URL={b.url} AGENTRUN_DATABASE_URL='{db_url}'")
    print('  agentrun runs submit "Which acme tickets are overdue?" && agentrun runs list')
    if model_url:
        print(f"  (local model at {model_url})")


def run(options: Options) -> int:
    # The embedded server's own chatter is not part of the story.
    logging.getLogger("pgserver").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", module="platformdirs")
    try:
        return asyncio.run(tell(options))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("\ninterrupted: everything the demo started has been stopped", file=sys.stderr)
        return 130
    except RuntimeError as e:
        print(f"agentrun demo: {e}", file=sys.stderr)
        return 1
