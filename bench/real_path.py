"""B9: worker CPU per step on the real path: `agentrun worker` calling a local Messages API through the SDK.

Three processes: a keep-alive local Messages API server (`FakeAnthropic` with a `ScriptResponder` that
asks for `--turns` no-op tool turns, then answers), an embedded PostgreSQL, and the real CLI worker
(`python -m agentrun.worker.cli worker`, ANTHROPIC_BASE_URL pointing at the server, a dummy
ANTHROPIC_API_KEY, AGENTRUN_TOOLS=bench._pg for its `noop` tool). The worker's CPU time (utime + stime
of /proc/<pid>/stat, all its threads) is read when it has claimed its first run and again when the last
run has finished, so start-up (imports, connecting) is not counted; so are the steps written meanwhile.
With `--client-calls N`, this process first measures the model client alone: CPU per call of
`AnthropicClient.send` against the same server, with and without a live watcher's `on_text`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from agentrun.worker.store import RunStore  # noqa: E402
from agentrun.worker.store.pool import open_pool  # noqa: E402
from bench import _pg  # noqa: E402

TARGET_CPU_MS = 1.0
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of process `pid` (every thread of it), in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # fields 14 and 15 of proc(5)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- the model server, in a process of its own so its CPU is not the worker's ---------------------------


async def _serve_model(port: int, turns_tool: str) -> None:

    from agentrun.worker.testing.fake_server import FakeAnthropic, ScriptResponder, serve_until_signalled

    server = FakeAnthropic(ScriptResponder(tool=turns_tool), port=port, record=False)
    await serve_until_signalled(server, "{server.base_url}")


@contextlib.contextmanager
def model_server() -> Iterator[str]:
    """A local Messages API in a child process; yields its base URL."""
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "--serve-model", str(_free_port())],
        stdout=subprocess.PIPE, text=True, cwd=REPO,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        if not url.startswith("http"):
            raise RuntimeError(f"the model server did not start (exit code {proc.poll()})")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# -- the client alone ------------------------------------------------------------------------------------


async def client_cost(base_url: str, calls: int, concurrency: int, streaming: bool,
                      transport: str = "aiohttp") -> dict[str, Any]:
    """CPU per `AnthropicClient.send` in this process, `calls` one-tool-turn requests, `concurrency` at once."""
    from agentrun.worker.core.types import LlmRequest
    from agentrun.worker.llm.anthropic_client import AnthropicClient

    client = AnthropicClient(api_key="bench-local-key", base_url=base_url, http_client=transport)  # type: ignore[arg-type]
    tools = [{"name": "noop", "description": "Does nothing.", "input_schema": {"type": "object"}}]
    request = LlmRequest(model=_pg.MODEL, max_tokens=1024, tools=tools,
                         messages=[{"role": "user", "content": "bench run=c turns=3"}],
                         on_text=(lambda text: None) if streaming else None)
    left = calls

    async def caller() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await client.send(request)

    try:
        await asyncio.gather(*(caller() for _ in range(min(concurrency, 5))))  # warm up: connections, imports
        left = calls
        cpu0, t0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(caller() for _ in range(concurrency)))
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
    finally:
        await client.aclose()
    return {"calls": calls, "concurrency": concurrency, "streaming": streaming, "http_client": transport,
            "cpu_ms_per_call": round(cpu * 1000 / calls, 3), "calls_per_s": round(calls / wall, 1)}


# -- the worker ------------------------------------------------------------------------------------------


async def bench(url: str, model_url: str, runs: int, turns: int, concurrency: int,
                extra_env: dict[str, str] | None = None, profile: str | None = None,
                log: Path | None = None) -> dict[str, Any]:
    """`runs` runs through a worker process; its stderr goes to `log` if given, else to this one's."""
    pool = await open_pool(url, max_size=2)
    try:
        store = RunStore(pool)
        for i in range(runs):
            await store.create(_pg.new_run(f"bench run={i} turns={turns}"))
        env = {
            **os.environ,
            "AGENTRUN_DATABASE_URL": url,
            "AGENTRUN_TOOLS": "bench._pg",
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
            "ANTHROPIC_BASE_URL": model_url,
            "ANTHROPIC_API_KEY": "bench-local-key",
            "AGENTRUN_DEFAULT_MODEL": _pg.MODEL,
            "AGENTRUN_LOG_LEVEL": "WARNING",
            **(extra_env or {}),
        }
        stderr = open(log, "wb") if log is not None else None  # noqa: SIM115 - the child owns it
        worker = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "agentrun.worker.cli", "worker", "--id", "bench-real-path",
            "--port", str(_free_port()), "--host", "127.0.0.1", "--concurrency", str(concurrency),
            "--poll-interval", "0.2", "--shutdown-grace", "5", "--no-migrate",
            env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=stderr,
        )
        if stderr is not None:
            stderr.close()
        try:
            return await _measure(pool, worker, runs, turns, concurrency, profile)
        finally:
            if worker.returncode is None:
                worker.terminate()
                try:
                    await asyncio.wait_for(worker.wait(), 30)
                except TimeoutError:
                    worker.kill()
                    await worker.wait()
    finally:
        await pool.close()


async def _measure(pool: Any, worker: asyncio.subprocess.Process, runs: int, turns: int,
                   concurrency: int, profile: str | None) -> dict[str, Any]:
    async def counts() -> tuple[int, int, int]:
        async with pool.connection() as conn:
            cur = await conn.execute(
                "SELECT count(*) FILTER (WHERE status <> 'QUEUED'), count(*) FILTER (WHERE finished_at IS NULL), "
                "(SELECT count(*) FROM run_step) FROM run")
            row = await cur.fetchone()
        assert row is not None
        return int(row[0]), int(row[1]), int(row[2])

    def alive() -> None:
        if worker.returncode is not None:
            raise RuntimeError(f"the worker exited with code {worker.returncode} before the runs finished")

    deadline = time.monotonic() + 120 + runs  # generous: a loaded machine is slow, never this slow
    while True:  # the window opens at the first claim: start-up is not the path being measured
        claimed, _, steps0 = await counts()
        cpu0, t0 = cpu_seconds(worker.pid), time.perf_counter()
        if claimed:
            break
        alive()
        if time.monotonic() > deadline:
            raise RuntimeError("the worker claimed nothing")
        await asyncio.sleep(0.01)
    spy = None
    if profile:  # py-spy (the bench extra) samples the worker over the measured window only
        fmt = "speedscope" if profile.endswith(".json") else "raw"
        spy = await asyncio.create_subprocess_exec(
            "py-spy", "record", "--pid", str(worker.pid), "--rate", "200", "-f", fmt, "-o", profile,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while True:
        await asyncio.sleep(0.05)
        _, left, steps = await counts()
        if left == 0:
            cpu1, t1 = cpu_seconds(worker.pid), time.perf_counter()
            break
        alive()
        if time.monotonic() > deadline:
            raise RuntimeError(f"{left} runs still unfinished at the deadline")
    if spy is not None:
        spy.send_signal(2)  # SIGINT: py-spy writes its file and exits
        await spy.wait()
    async with pool.connection() as conn:
        statuses = dict(await (await conn.execute("SELECT status, count(*) FROM run GROUP BY status")).fetchall())
    measured = steps - steps0
    cpu_ms = (cpu1 - cpu0) * 1000 / measured if measured else float("nan")
    return {
        "runs": runs, "turns": turns, "concurrency": concurrency, "steps": steps, "steps_measured": measured,
        "seconds": round(t1 - t0, 3), "worker_cpu_s": round(cpu1 - cpu0, 3),
        "cpu_ms_per_step": round(cpu_ms, 3), "steps_per_s": round(measured / (t1 - t0), 1),
        "statuses": statuses, "target_cpu_ms_per_step": TARGET_CPU_MS,
        "met": cpu_ms <= TARGET_CPU_MS and statuses == {"SUCCEEDED": runs},
    }


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--serve-model":
        asyncio.run(_serve_model(int(sys.argv[2]), "noop"))
        return
    p = _pg.parser(__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=1000)
    p.add_argument("--turns", type=int, default=3, help="tool turns a run (each run is 2 × turns + 1 steps)")
    p.add_argument("--concurrency", type=int, default=32, help="the worker's --concurrency")
    p.add_argument("--client-calls", type=int, default=0, metavar="N",
                   help="first measure the model client alone: N calls at concurrency 20 (default: skip)")
    p.add_argument("--http-client", choices=["aiohttp", "httpx"], default=None,
                   help="the SDK transport the worker uses (AGENTRUN_LLM_HTTP_CLIENT; default: the worker's default)")
    p.add_argument("--profile", metavar="FILE",
                   help="record the worker with py-spy over the measured window (FILE.json: speedscope, else raw); "
                   "py-spy samples cost the worker CPU too, so take the figures from a run without it")
    args = p.parse_args()
    figures: dict[str, Any] = {}
    with model_server() as model_url:
        if args.client_calls:
            figures["client"] = [asyncio.run(client_cost(model_url, args.client_calls, 20, streaming, transport))
                                 for transport in ("aiohttp", "httpx") for streaming in (False, True)]
        with _pg.database(args.database_url) as url:
            env = _pg.describe(url)
            figures.update(asyncio.run(bench(
                url, model_url, args.runs, args.turns, args.concurrency, profile=args.profile,
                extra_env={"AGENTRUN_LLM_HTTP_CLIENT": args.http_client} if args.http_client else None)))
    figures.update(env, http_client=args.http_client or "default")
    print(f"B9 the real path: {args.runs} runs × {2 * args.turns + 1} steps through `agentrun worker "
          f"--concurrency {args.concurrency}` and the Anthropic SDK ({args.http_client or 'default'} transport), "
          "against a local Messages API")
    for c in figures.get("client", []):
        print(f"  client alone, {c['http_client']}, {'streamed (a watcher)' if c['streaming'] else 'not streamed'}: "
              f"{c['cpu_ms_per_call']} ms CPU per call, {c['calls_per_s']} calls/s at concurrency {c['concurrency']}")
    print(f"  {figures['steps_measured']} steps in {figures['seconds']} s ({figures['steps_per_s']} steps/s); "
          f"worker CPU {figures['worker_cpu_s']} s: {figures['cpu_ms_per_step']} ms per step "
          f"(target ≤ {TARGET_CPU_MS:g} ms: {'met' if figures['met'] else 'MISSED'})")
    print(f"  statuses: {figures['statuses']}; PostgreSQL {env['postgres']} over {env['db_host']}, "
          f"{env['cores']} cores")
    _pg.emit(figures)


if __name__ == "__main__":
    main()
