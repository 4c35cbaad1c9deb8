"""B15 the submit path (issue 48 §3): `POST /api/runs` from concurrent clients against one worker process.

The issue numbers this figure B11; bench/README.md's B11 is the fair share already, so it is B15 here.
One `agentrun worker --concurrency 0` process (the API only: no run is claimed, so what is measured is the
submit path alone) over a migrated database; `--clients` aiohttp clients in this process each POST runs one
after another, every one with an Idempotency-Key of its own, and every `--retry-every`-th request is sent
again with the same key and body at once, as a client retrying after a lost answer would. Then the runs are
counted in the database: every key must name exactly one run, and nothing else may have been made. The
target: ≥ 2,000 submissions/s with p99 ≤ 50 ms at 32 clients, every run made exactly once.

The three parts share this machine's cores, so the CPU each took over the measured submissions is reported
too (from /proc): the API process's, this process's (the clients') and PostgreSQL's (when it runs here), in
ms a submission. The API's is what a change to the submit path moves; submissions/s moves with the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import psycopg  # noqa: E402

from bench import _pg  # noqa: E402
from bench.capacity import cpu, postmaster_of  # noqa: E402
from bench.real_path import cpu_seconds  # noqa: E402

TARGET_PER_S = 2000.0
TARGET_P99_MS = 50.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def missed_targets(per_s: float, p99_ms: float, exact: bool, errors: int) -> list[str]:
    """What of the target a measurement misses (empty: met)."""
    missed = []
    if per_s < TARGET_PER_S:
        missed.append(f"{per_s:.0f} submissions/s below {TARGET_PER_S:.0f}")
    if p99_ms > TARGET_P99_MS:
        missed.append(f"p99 {p99_ms:.1f} ms above {TARGET_P99_MS:.0f}")
    if not exact:
        missed.append("runs made differ from keys sent")
    if errors:
        missed.append(f"{errors} failed requests")
    return missed


@contextlib.asynccontextmanager
async def api_process(database_url: str, log: Path | None = None) -> Any:
    """`agentrun worker --concurrency 0` on a free port; yields its base URL and pid once it is ready."""
    import aiohttp

    port = _free_port()
    env = {
        **os.environ,
        "AGENTRUN_DATABASE_URL": database_url,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        "ANTHROPIC_API_KEY": "bench-local-key",
        "AGENTRUN_DEFAULT_MODEL": _pg.MODEL,
        "AGENTRUN_LOG_LEVEL": "WARNING",
    }
    stderr = open(log, "wb") if log is not None else None  # noqa: SIM115 - the child owns it
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agentrun.worker.cli", "worker", "--id", "bench-submit", "--port", str(port),
        "--host", "127.0.0.1", "--concurrency", "0", "--shutdown-grace", "5", "--no-migrate",
        env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=stderr,
    )
    if stderr is not None:
        stderr.close()
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        async with aiohttp.ClientSession() as http:
            while True:
                if proc.returncode is not None:
                    raise RuntimeError(f"the worker exited ({proc.returncode}) before it was ready")
                with contextlib.suppress(aiohttp.ClientError):
                    async with http.get(f"{base}/readyz") as r:
                        if r.status == 200:
                            break
                if time.monotonic() > deadline:
                    raise RuntimeError("the worker was not ready within 60 s")
                await asyncio.sleep(0.1)
        yield base, proc.pid
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 30)
            except TimeoutError:
                proc.kill()
                await proc.wait()


async def drive(base: str, clients: int, submissions: int, retry_every: int) -> dict[str, Any]:
    """`submissions` POSTs from `clients` clients; returns latencies, errors and the keys sent."""
    import aiohttp

    latencies: list[float] = []
    copies: list[float] = []  # the latencies of the retries alone
    errors: dict[str, int] = {}
    keys: list[str] = []
    ids: dict[str, set[str]] = {}
    next_i = 0
    body = {"input": "benchmark submission", "model": _pg.MODEL, "tokenBudget": 100_000, "timeoutSeconds": 3600}

    async def post(http: aiohttp.ClientSession, key: str, copy: bool = False) -> None:
        t0 = time.perf_counter()
        async with http.post(f"{base}/api/runs", json=body, headers={"Idempotency-Key": key}) as r:
            payload = await r.json(content_type=None)
        latencies.append(time.perf_counter() - t0)
        if copy:
            copies.append(latencies[-1])
        if r.status != 201:
            errors[str(r.status)] = errors.get(str(r.status), 0) + 1
            return
        ids.setdefault(key, set()).add(str(payload["id"]))

    async def client() -> None:
        nonlocal next_i
        connector = aiohttp.TCPConnector(limit=2)
        async with aiohttp.ClientSession(connector=connector) as http:
            while next_i < submissions:
                i, next_i = next_i, next_i + 1
                key = f"bench-{uuid.uuid4().hex}"
                keys.append(key)
                if retry_every and i % retry_every == 0:
                    await asyncio.gather(post(http, key), post(http, key, copy=True))  # a first copy, its retry at once
                else:
                    await post(http, key)

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    elapsed = time.perf_counter() - t0
    return {"latencies": latencies, "copies": copies, "errors": errors, "keys": keys, "ids": ids, "seconds": elapsed}


async def bench(database_url: str, clients: int = 32, submissions: int = 4200, retry_every: int = 10,
                warmup: int = 200, log: Path | None = None) -> dict[str, Any]:
    postmaster = postmaster_of(database_url)
    async with api_process(database_url, log) as (base, pid):
        if warmup:
            await drive(base, clients, warmup, 0)  # connections opened, code paths warm: not measured
        before = cpu_seconds(pid), cpu_seconds(os.getpid()), cpu(postmaster)
        measured = await drive(base, clients, submissions, retry_every)
        after = cpu_seconds(pid), cpu_seconds(os.getpid()), cpu(postmaster)
    api_ms, client_ms, postgres_ms = ((a - b) * 1000 / submissions for a, b in zip(after, before, strict=True))
    with psycopg.connect(database_url) as conn:
        rows = conn.execute("SELECT idempotency_key, count(*) FROM run WHERE idempotency_key = ANY(%s) "
                            "GROUP BY idempotency_key", (measured["keys"],)).fetchall()
    per_key = dict(rows)
    made = sum(per_key.values())
    once = all(per_key.get(k) == 1 for k in measured["keys"])
    one_id_per_key = all(len(v) == 1 for v in measured["ids"].values())
    lat = measured["latencies"]
    requests = len(lat)
    per_s = len(measured["keys"]) / measured["seconds"]
    p50, p99 = percentile(lat, 0.50) * 1000, percentile(lat, 0.99) * 1000
    errors = sum(measured["errors"].values())
    exact = once and one_id_per_key and made == len(measured["keys"])
    missed = missed_targets(per_s, p99, exact, errors)
    return {
        "clients": clients, "submissions": len(measured["keys"]), "requests": requests,
        "retries": requests - len(measured["keys"]), "runs_made": made, "exactly_once": exact,
        "errors": measured["errors"], "seconds": round(measured["seconds"], 2),
        "submissions_per_s": round(per_s, 1), "p50_ms": round(p50, 1), "p99_ms": round(p99, 1),
        "retries_p99_ms": round(percentile(measured["copies"], 0.99) * 1000, 1),
        "api_cpu_ms": round(api_ms, 3), "client_cpu_ms": round(client_ms, 3), "postgres_cpu_ms": round(postgres_ms, 3),
        "met": not missed, "missed": missed,
    }


def main() -> None:
    p = _pg.parser(__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=32, help="concurrent clients (default: 32)")
    p.add_argument("--submissions", type=int, default=4200, help="runs submitted, retries aside (default: 4200)")
    p.add_argument("--retry-every", type=int, default=10, metavar="N",
                   help="every N-th submission is sent twice at once with its Idempotency-Key (0: never; default: 10)")
    p.add_argument("--log", type=Path, help="the worker's stderr goes here (default: this process's)")
    args = p.parse_args()
    with _pg.database(args.database_url) as url:
        env = _pg.describe(url)
        figures = asyncio.run(bench(url, args.clients, args.submissions, args.retry_every, log=args.log))
    figures.update(env)
    print(f"B15 the submit path: {figures['submissions']} POST /api/runs from {args.clients} clients against one "
          f"worker process (API only), every {args.retry_every}-th sent twice with its Idempotency-Key")
    print(f"  {figures['submissions_per_s']} submissions/s, p50 {figures['p50_ms']} ms, p99 {figures['p99_ms']} ms "
          f"(the retries' {figures['retries_p99_ms']} ms); "
          f"{figures['runs_made']} runs made for {figures['submissions']} keys "
          f"({'exactly once' if figures['exactly_once'] else 'NOT exactly once'}); errors {figures['errors']}")
    print(f"  CPU a submission: API process {figures['api_cpu_ms']} ms, clients {figures['client_cpu_ms']} ms, "
          f"PostgreSQL {figures['postgres_cpu_ms']} ms")
    print(f"  target ≥ {TARGET_PER_S:.0f}/s, p99 ≤ {TARGET_P99_MS:.0f} ms, exactly once: "
          f"{'met' if figures['met'] else 'MISSED (' + '; '.join(figures['missed']) + ')'}")
    print(f"  PostgreSQL {env['postgres']} over {env['db_host']}, {env['cores']} cores")
    _pg.emit(figures)


if __name__ == "__main__":
    main()
